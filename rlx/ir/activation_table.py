"""The activation table: `templates/activations.toml` read once, checked against the ops' ACTIVATIONS.

Every activation has one entry there, in id order: its `RLX_ACT_*` id (shared by the CUDA and Metal
kernels and the CUTLASS kernel unit), whether the CUTLASS unit fuses it, and either its scalar formula
(written once; `rlx.codegen.activations` renders it into C, CUDA and MSL) or the per-language
expressions that call a hand-written function. This module holds the data; the languages are codegen's.

>>> t = activation_table()
>>> t.entry("gelu").id, t.entry("silu").id, t.entry("silu").enum
(1, 3, 'RLX_ACT_SILU')
>>> t.entry("mish").formula
'x * tanh(softplus(x))'
>>> t.cutlass_ids
{'gelu': 1, 'silu': 3}
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass

from rlx.errors import IRError
from rlx.ir.ops import ACTIVATIONS
from rlx.templates_path import templates_dir

#: The table's file, under templates/.
TABLE = "activations.toml"
#: Keys an entry may have (the per-language ones override the call of a hand-written function).
_KEYS = {"name", "formula", "c_int", "cuda", "metal", "cutlass"}


@dataclass(frozen=True)
class ActivationDef:
    """One activation of the table. `formula` is empty for a hand-written one; `c_int`, `cuda` and `metal`
    are expressions of `x` replacing that language's default call (empty: the default)."""

    name: str
    id: int
    formula: str = ""
    c_int: str = ""
    cuda: str = ""
    metal: str = ""
    cutlass: bool = False

    @property
    def enum(self) -> str:
        """Its C enum constant (CUDA and Metal `rlx_act<ACT>`, the CUTLASS unit's -D flags)."""
        return "RLX_ACT_" + self.name.upper()


@dataclass(frozen=True)
class ActivationTable:
    entries: tuple[ActivationDef, ...]

    def entry(self, name: str) -> ActivationDef:
        for e in self.entries:
            if e.name == name:
                return e
        raise IRError(f"activation {name!r} has no entry in templates/{TABLE}")

    def enum(self, name: str | None) -> str:
        """The enum constant of activation `name` (RLX_ACT_NONE for no activation)."""
        return "RLX_ACT_NONE" if name is None else self.entry(name).enum

    @property
    def formulas(self) -> tuple[ActivationDef, ...]:
        """The activations defined by their formula (each backend renders their functions)."""
        return tuple(e for e in self.entries if e.formula)

    @property
    def cutlass_ids(self) -> dict[str, int]:
        """name -> id of the activations the CUTLASS GEMM unit fuses."""
        return {e.name: e.id for e in self.entries if e.cutlass}


def parse_table(text: str) -> ActivationTable:
    """The table of TOML `text`, checked: known keys, a formula or none, the names those of ACTIVATIONS.

    >>> parse_table('[[activation]]\\nname = "gelu"\\n')
    Traceback (most recent call last):
      ...
    rlx.errors.IRError: templates/activations.toml lacks ['abs', 'cos', ...]; each of ops.ACTIVATIONS needs one
    """
    raw = tomllib.loads(text).get("activation", [])
    entries = []
    for k, item in enumerate(raw, start=1):
        unknown = set(item) - _KEYS
        if unknown or "name" not in item:
            raise IRError(f"templates/{TABLE}: entry {k} has unknown keys {sorted(unknown)} or no name")
        if item.get("formula") and any(item.get(lang) for lang in ("c_int", "cuda", "metal")):
            raise IRError(f"templates/{TABLE}: {item['name']!r} has a formula and per-language overrides; "
                          "a formula is the one definition")
        entries.append(ActivationDef(id=k, **item))
    names = [e.name for e in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    missing = sorted(set(ACTIVATIONS) - set(names))
    extra = sorted(set(names) - set(ACTIVATIONS))
    if dup:
        raise IRError(f"templates/{TABLE}: activations {dup} appear twice")
    if missing:
        shown = ", ".join(repr(n) for n in missing[:2]) + (", ..." if len(missing) > 2 else "")
        raise IRError(f"templates/{TABLE} lacks [{shown}]; each of ops.ACTIVATIONS needs one")
    if extra:
        raise IRError(f"templates/{TABLE} has activations {extra} that rlx.ir.ops.ACTIVATIONS does not name")
    return ActivationTable(tuple(entries))


@functools.lru_cache(maxsize=1)
def activation_table() -> ActivationTable:
    """The process's activation table (read once)."""
    return parse_table((templates_dir() / TABLE).read_text())
