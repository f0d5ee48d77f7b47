"""Serving many users: an engine with continuous batching (`Engine`), usable without HTTP, and the
OpenAI-compatible HTTP server of `rlxc serve` (`rlx.serving.server`, needs the `serve` extra).

>>> from rlx.serving import Engine, SamplingParams
>>> SamplingParams(max_tokens=8).max_tokens
8
"""

from rlx.serving.engine import Completion, Engine, EngineClosed, Event, Request, SamplingParams
from rlx.serving.kv import KvStore, SlotKv
from rlx.serving.pages import PagedKv, PagePool
from rlx.serving.runner import CausalLMRunner, PagedRunner, Runner
from rlx.serving.scheduler import Plan, QueueFull, Scheduler

__all__ = ["CausalLMRunner", "Completion", "Engine", "EngineClosed", "Event", "KvStore", "PagePool", "PagedKv",
           "PagedRunner", "Plan", "QueueFull", "Request", "Runner", "SamplingParams", "Scheduler", "SlotKv"]
