"""The activation table (templates/activations.toml) read and checked by rlx.ir.activation_table."""

from __future__ import annotations

import pytest

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.activation_table import TABLE, activation_table, parse_table
from rlx.templates_path import templates_dir


def _text() -> str:
    return (templates_dir() / TABLE).read_text()


def test_one_entry_per_activation_with_ids_in_table_order():
    t = activation_table()
    assert sorted(e.name for e in t.entries) == sorted(O.ACTIVATIONS)
    assert [e.id for e in t.entries] == list(range(1, len(O.ACTIVATIONS) + 1))
    assert t.enum(None) == "RLX_ACT_NONE"
    assert t.enum("gelu_tanh") == "RLX_ACT_GELU_TANH"


def test_the_new_activations_are_formulas_and_the_cutlass_ones_are_marked():
    t = activation_table()
    assert {e.name for e in t.formulas} >= {"mish", "hardswish"}
    assert set(t.cutlass_ids) == {"gelu", "silu"}


def test_ids_are_table_positions():
    """Moving an entry moves its id, and the CUTLASS ids with it (they are read from the table, never kept)."""
    silu = '[[activation]]\nname = "silu"\ncutlass = true\n\n'
    relu = '[[activation]]\nname = "relu"\nc_int = "x > 0 ? x : 0"\n\n'
    text = _text()
    assert silu in text and relu in text
    t = parse_table(text.replace(silu + relu, relu + silu))
    assert (t.entry("relu").id, t.entry("silu").id) == (3, 4)
    assert t.cutlass_ids == {"gelu": 1, "silu": 4}


def test_an_entry_the_ops_do_not_name_is_refused():
    text = _text().replace('[[activation]]\nname = "silu"', '[[activation]]\nname = "extra"\n\n'
                           '[[activation]]\nname = "silu"')
    with pytest.raises(IRError, match=r"\['extra'\] that rlx.ir.ops.ACTIVATIONS does not name"):
        parse_table(text)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s.replace('name = "hardswish"', 'name = "mish"'), "appear twice"),
    (lambda s: s.replace('name = "cos"\n', 'name = "cos"\nmsl = "cos(x)"\n'), "unknown keys"),
    (lambda s: s.replace('formula = "x * tanh(softplus(x))"', 'formula = "x"\ncuda = "x"'), "a formula is the one"),
    (lambda s: s.replace('[[activation]]\nname = "softplus"\n', ""), r"lacks \['softplus'\]"),
])
def test_a_malformed_table_is_refused_naming_the_problem(edit, message):
    with pytest.raises(IRError, match=message):
        parse_table(edit(_text()))
