"""Build variants (profiled, NaN-checked) are keyed apart from the normal build, in the cache and its index."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import rlx
from rlx.config import Config
from rlx.pipeline.cpu import cpu_key_components
from rlx.toolchain.compiler import detect_toolchain
from rlx.toolchain.cpu import cpu_toolchain_components


def graph() -> rlx.Graph:
    g = rlx.Graph("variants")
    g.set_outputs([g.activation("tanh", g.input("x", [rlx.Dim.dynamic("n", max=4), 8]))])
    return g


def test_variant_component_only_for_variants():
    config = Config(blas="none", cache_enabled=False)
    tc = detect_toolchain(config)
    assert "variant" not in cpu_toolchain_components(tc, config)
    assert cpu_toolchain_components(tc, dataclasses.replace(config, profile=True))["variant"] == "profile"
    both = dataclasses.replace(config, profile=True, check_nans=True)
    assert cpu_toolchain_components(tc, both)["variant"] == "profile+check_nans"
    lir = rlx.Session(config=config).lower(graph())
    normal, profiled = cpu_key_components(lir, tc, config), cpu_key_components(lir, tc, both)
    assert normal["source"] != profiled["source"] and normal["lir"] == profiled["lir"]


def test_each_variant_has_its_own_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RLX_PROFILE", raising=False)
    monkeypatch.delenv("RLX_CHECK_NANS", raising=False)
    built = {}
    for name, kwargs in (("normal", {}), ("profile", {"profile": True}), ("check_nans", {"check_nans": True})):
        cg = rlx.Session(**kwargs).compile(graph())
        assert not cg.cache_hit
        assert cg.manifest.get("variant", "normal") == name
        built[name] = cg.key
    assert len(set(built.values())) == 3
    # again, through the compile index: each variant finds its own entry
    for name, kwargs in (("check_nans", {"check_nans": True}), ("normal", {}), ("profile", {"profile": True})):
        cg = rlx.Session(**kwargs).compile(graph())
        assert cg.cache_hit and cg.key == built[name]
        assert cg.profiled == (name == "profile")
