"""Row gathers done inside the elementwise region that reads them (rlx/codegen/cuda/region_gather.py) on the GPU:
the same values as rlx.reference and as the build with gather kernels (`gather_region=False`), and a bad index
still raises the gather's error."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.errors import ExecutionError
from tests.gpu.gemm_common import GPU_ONLY, build_with_params
from tests.gpu.region_gather_common import embed_feed, embed_graph

pytestmark = GPU_ONLY



@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
def test_lookups_in_the_region_match_reference_and_gather_kernels(precision: str) -> None:
    graph = embed_graph()
    params = embed_feed(1, 1)[1]
    fused = build_with_params(graph, precision, params)
    plain = build_with_params(graph, precision, params, gather_region=False)
    assert "rlx_gather_at<" in fused.source and "rlx_gather_at<" not in plain.source
    atol = {"f32": 1e-6, "f16": 2e-2, "bf16": 1e-1}[precision]
    for batch, seq in ((1, 12), (3, 5), (4, 12)):
        feed, _ = embed_feed(batch, seq, seed=batch)
        ref = reference.run(graph, feed, params)[0]
        got, base = fused.run(feed)[0], plain.run(feed)[0]
        np.testing.assert_allclose(got, ref, rtol=0, atol=atol)
        np.testing.assert_array_equal(got, base)  # the same arithmetic, one kernel instead of three
    feed, _ = embed_feed(2, 6)
    feed["ids"][1, 3] = 50  # == the vocabulary size
    with pytest.raises(ExecutionError, match="gather index out of range"):
        fused.run(feed)
    feed["ids"][1, 3] = 1
    np.testing.assert_allclose(fused.run(feed)[0], reference.run(graph, feed, params)[0], rtol=0, atol=atol)
