"""`rlxc doctor`'s tile-unit line (rlx.toolchain.tile_unit): what the AMX paths of CPU builds do here, and why not."""

from __future__ import annotations

from rlx.toolchain.isa import cpu_flags
from rlx.toolchain.tile_unit import linux_grants_tiles, tile_unit_report

AMX = frozenset({"amx_tile", "amx_bf16", "amx_int8", "avx512f"})


def test_each_reason_is_named() -> None:
    asked = []

    def grant() -> bool:
        asked.append(1)
        return True

    assert tile_unit_report(None, "native", grant).startswith("none on this CPU")
    assert tile_unit_report(frozenset({"amx_tile"}), "native", grant).startswith("none on this CPU")  # no products
    assert "left out by the build ISA x86-64-v3" in tile_unit_report(AMX, "x86-64-v3", grant)
    assert not asked  # Linux is asked only where the build would use the unit
    assert "refused by Linux" in tile_unit_report(AMX, "native:sapphirerapids", lambda: False)
    both = tile_unit_report(AMX, "native:sapphirerapids", grant)
    assert both.startswith("AMX-BF16, AMX-INT8, granted") and "bf16 GEMMs" in both and "int8 GEMMs" in both
    only = tile_unit_report(frozenset({"amx_tile", "amx_int8"}), "native", grant)
    assert only.startswith("AMX-INT8, granted") and "bf16" not in only


def test_this_machine_gets_an_answer() -> None:
    flags = cpu_flags()
    report = tile_unit_report(flags, "native")
    if flags is not None and {"amx_tile", "amx_bf16"} <= flags:
        assert report.startswith("AMX-BF16") and ("granted" in report) == linux_grants_tiles()
    else:
        assert report.startswith("none on this CPU")
