"""The CPU backend: one C file (OpenMP + BLAS) per graph; its emitter, rules and C helpers.

`emit` holds the emitter (`CpuEmitter`, `c_context`, `render_c`, `memory_plan`), `params` the param
storage layout, `rules` the core rules; each rule module (`rules`, `decoder`, `quant`, ...) declares
its rules in its `RULES`, and `rule_table()` makes the backend's table from the modules listed there
(the one list: a new CPU rule module is added to it).

>>> sorted(rule_table().rules)[:3]
['activation', 'all_gather', 'all_reduce']
"""

from __future__ import annotations

import functools

from rlx.codegen.registry import RuleTable


@functools.cache
def rule_table() -> RuleTable:
    """The CPU rule table: every rule of the CPU rule modules (made once per process)."""
    from rlx.codegen.cpu import (
        collectives,
        control,
        conv,
        decoder,
        feedback,
        int8,
        lora,
        moe,
        quant,
        rules,
        sample,
        scan,
        select,
        ssm,
        user_op,
    )

    modules = (rules, collectives, control, conv, decoder, feedback, int8, lora, moe, quant, sample, scan, select, ssm,
               user_op)
    return RuleTable.of("cpu", (m.RULES for m in modules))
