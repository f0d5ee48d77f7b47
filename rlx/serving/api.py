"""The OpenAI request bodies `rlxc serve` takes, checked field by field into `SamplingParams`.

Checks raise `ApiError` (an HTTP status and an OpenAI-style error body); fields the server does
not know are ignored, known ones of the wrong type or out of range are refused.

>>> p = completion_request({"model": "m", "prompt": "hi", "max_tokens": 5, "stop": "\\n"}, max_context=64)
>>> p.params.max_tokens, p.params.stop, p.n, p.stream
(5, ('\\n',), 1, False)
>>> completion_request({"model": "m", "prompt": "hi", "max_tokens": -1}, max_context=64)
Traceback (most recent call last):
rlx.serving.api.ApiError: 400: max_tokens must be an integer >= 1, got -1
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlx.errors import RlxError
from rlx.serving.engine import SamplingParams

#: The most choices one request may ask for (`n`).
MAX_N = 16
#: The most stop strings (as OpenAI).
MAX_STOP = 4


class ApiError(RlxError):
    """An HTTP error with an OpenAI-style body: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenerationRequest:
    """A checked completion or chat request: the prompt (text, token ids or chat messages) and how to answer."""

    model: str
    prompt: str | list[int] | None
    messages: list[dict[str, Any]] | None
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _get(body: Mapping[str, Any], key: str, types: type | tuple[type, ...], what: str, default: Any = None) -> Any:
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in (types if isinstance(types, tuple)
                                                                            else (types,)))
    if not ok:
        raise ApiError(400, f"{key} must be {what}, got {json.dumps(v)[:80]}", param=key)
    return v


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int | None, default: Any = None) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ApiError(400, f"{key} must be an integer {rng}, got {json.dumps(v)[:80]}", param=key)
    return v


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not (lo < v if lo_open else lo <= v) or v > hi:
        raise ApiError(400, f"{key} must be a number in {'(' if lo_open else '['}{lo}, {hi}], got "
                            f"{json.dumps(v)[:80]}", param=key)
    return float(v)


def _common(body: Mapping[str, Any], max_context: int, logprobs: bool, top_logprobs: int) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model must be a non-empty string", param="model")
    max_tokens = _int(body, "max_completion_tokens", 1, None) or _int(body, "max_tokens", 1, None) or 16
    if max_tokens >= max_context:
        raise ApiError(400, f"max_tokens ({max_tokens}) must be below the context of {max_context} tokens",
                       param="max_tokens", code="context_length_exceeded")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or len(stop) > MAX_STOP
                             or not all(isinstance(s, str) for s in stop)):
        raise ApiError(400, f"stop must be a string or a list of at most {MAX_STOP} strings", param="stop")
    temperature = _number(body, "temperature", 0.0, 2.0)
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0 if temperature is None else temperature,
                            top_p=_number(body, "top_p", 0.0, 1.0, lo_open=True), top_k=_int(body, "top_k", 1, None),
                            seed=_int(body, "seed", -(2**63), 2**63 - 1), stop=tuple(stop or ()),
                            logprobs=logprobs, top_logprobs=top_logprobs)
    options = _get(body, "stream_options", dict, "an object", {})
    return {"model": model, "params": params, "n": _int(body, "n", 1, MAX_N, 1),
            "stream": _get(body, "stream", bool, "a boolean", False),
            "include_usage": bool(_get(options, "include_usage", bool, "a boolean", False))}


def completion_request(body: Mapping[str, Any], max_context: int) -> GenerationRequest:
    """A `/v1/completions` body: `prompt` is a string, a list of token ids, or a list of one of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise ApiError(400, "prompt must be a string or a non-empty list of token ids (one prompt per request)",
                           param="prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt must be a non-empty string or a list of token ids", param="prompt")
    logprobs = _int(body, "logprobs", 0, 5)
    common = _common(body, max_context, logprobs is not None, logprobs or 0)
    return GenerationRequest(prompt=prompt, messages=None, **common)


def chat_request(body: Mapping[str, Any], max_context: int) -> GenerationRequest:
    """A `/v1/chat/completions` body: `messages` of `{"role", "content"}` (content a string or text parts)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string role", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # text parts
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"messages[{i}].content parts must be text parts", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string", param="messages")
        checked.append({"role": m["role"], "content": content})
    logprobs = _get(body, "logprobs", bool, "a boolean", False)
    top = _int(body, "top_logprobs", 0, 20, 0)
    common = _common(body, max_context, logprobs, top if logprobs else 0)
    return GenerationRequest(prompt=None, messages=checked, **common)


def embedding_inputs(body: Mapping[str, Any]) -> tuple[str, list[str]]:
    """A `/v1/embeddings` body: the model name and the input strings."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model must be a non-empty string", param="model")
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) and s for s in inputs):
        raise ApiError(400, "input must be a non-empty string or a non-empty list of non-empty strings",
                       param="input")
    if len(inputs) > 256:
        raise ApiError(400, f"input holds {len(inputs)} strings; at most 256 a request", param="input")
    return model, inputs
