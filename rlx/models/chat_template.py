"""Chat templates rendered the way Hugging Face tokenizers render them.

The environment follows transformers' (`apply_chat_template`): a sandboxed, immutable Jinja
environment with `trim_blocks` and `lstrip_blocks`, loop controls, a `{% generation %}` block
tag that renders its body, a `tojson` filter that does not escape HTML (`ensure_ascii`, `indent`,
`separators`, `sort_keys` options), globals `raise_exception`, `strftime_now`, `dict` and a
`namespace` that refuses underscore names. The template sees `messages`, `tools`, `documents`,
`add_generation_prompt` and the tokenizer's named special tokens (`bos_token`, `eos_token`, ...).

>>> render("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
...        "{% if add_generation_prompt %}<assistant>{% endif %}",
...        [{"role": "user", "content": "hi"}], add_generation_prompt=True)
'<user>hi<assistant>'
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, ClassVar

from rlx.errors import ArtifactError, ExecutionError


class TemplateRefused(ExecutionError):
    """`raise_exception(...)` called by a chat template (a role it does not accept, ...)."""


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@cache
def compile_template(source: str) -> Any:
    """The compiled Jinja template of `source` (cached); `ArtifactError` if it does not parse."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}`: marks assistant text (for masks); renders its body."""

        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set namespace attribute {name!r}")

    def raise_exception(message: str) -> None:
        raise TemplateRefused(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.globals["dict"] = lambda *a, **kw: dict(*a, **kw)
    env.globals["namespace"] = Namespace
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise ArtifactError(f"the chat template does not parse: {exc}") from None


def render(source: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False,
           special_tokens: Mapping[str, str] | None = None, tools: Any = None, documents: Any = None,
           **extra: Any) -> str:
    """`source` rendered for `messages` (dicts with a str "role"); `extra` reaches the template as variables."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ExecutionError("messages must be a list of {'role': ..., 'content': ...} dicts")
    for n, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ExecutionError(f"message {n} must be a dict with a str 'role', got {m!r}")
    template = compile_template(source)
    variables = {**(special_tokens or {}), **extra}
    try:
        return template.render(messages=[dict(m) for m in messages], tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **variables)
    except TemplateRefused:
        raise
    except Exception as exc:  # a Jinja error inside the checkpoint's template
        raise ArtifactError(f"the chat template failed: {type(exc).__name__}: {exc}") from None
