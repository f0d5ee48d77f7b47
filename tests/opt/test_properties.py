"""Every pass, and every pipeline, preserves the reference outputs of random graphs.

Passes that do not touch arithmetic (fold evaluates with the reference itself;
simplify removes exact identities; cse, dce and layout move no arithmetic;
elementwise regions round every step like the unfused ops) must be
bit-identical. The matmul / norm / SwiGLU fusions skip intermediate roundings,
so they get the tolerance explained in `graphs.assert_equivalent`.
"""

from __future__ import annotations

import pytest
from graphs import Case, assert_equivalent, random_cases
from hypothesis import HealthCheck, given, settings

from rlx.opt.pipeline import PASSES, PIPELINES, abi, optimize

EXACT_PASSES = ("fold", "simplify", "cse", "dce", "layout", "fuse_elementwise")
# "bodies" runs the whole pipeline (fusions included) inside scan bodies
ROUNDING_PASSES = ("fuse_swiglu", "fuse_matmul_epilogue", "fuse_conv_activation", "fuse_residual_norm", "bodies")
assert set(EXACT_PASSES + ROUNDING_PASSES) == set(PASSES)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_pass(name: str, case: Case) -> None:
    before = case.graph
    text = str(before)
    after = PASSES[name](before)
    assert str(before) == text, f"{name} mutated its input"
    assert after is not before
    after.verify()
    assert abi(after) == abi(before)
    assert after.name == before.name
    assert_equivalent(before, after, case, exact=name in EXACT_PASSES)


@pytest.mark.parametrize("name", sorted(PASSES))
@SETTINGS
@given(case=random_cases())
def test_pass_preserves_outputs(name: str, case: Case) -> None:
    _check_pass(name, case)


@pytest.mark.parametrize("level", sorted(PIPELINES))
@SETTINGS
@given(case=random_cases())
def test_pipeline_preserves_outputs(level: int, case: Case) -> None:
    out = optimize(case.graph, level, debug=True)
    assert abi(out) == abi(case.graph)
    assert_equivalent(case.graph, out, case, exact=level <= 1)
    # Optimizing again is safe and changes nothing more than float reassociation.
    again = optimize(out, level, debug=True)
    assert_equivalent(case.graph, again, case, exact=level <= 1)


@SETTINGS
@given(case=random_cases())
def test_level1_reaches_a_fixpoint_on_cleanup(case: Case) -> None:
    once = optimize(case.graph, 1)
    assert len(optimize(once, 1)) <= len(once)
