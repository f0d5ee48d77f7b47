"""The OpenMP wait policy (RLX_OMP_WAIT): set before libgomp loads, read by libgomp, never over a user's own
setting; and libraries stay mapped so spinning OpenMP threads survive interpreter exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlx.config import Config, omp_environment
from rlx.errors import RlxError
from rlx.runtime.team import openmp_spins

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import os, numpy as np, rlx
    def gomp_loaded():
        return any("libgomp" in line for line in open("/proc/self/maps"))
    before = gomp_loaded()
    g = rlx.Graph("omp_policy")
    x = g.input("x", [256, 128])
    g.set_outputs([g.softmax(g.matmul(x, g.param("w", [128, 128])))])
    cg = rlx.Session().compile(g, num_threads=2)
    cg.set_param("w", np.ones((128, 128), np.float32))
    for _ in range(5):
        cg.run(x=np.ones((256, 128), np.float32))
    print("GOMP_BEFORE_LOAD", before, "AFTER", gomp_loaded())
    print("ENV", os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
    print("POLICY", cg.team.policy.spins, cg.team.policy.adaptive)
""")


def _child(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "RLX_OMP_WAIT")}
    full.update({"PYTHONPATH": str(REPO), "OMP_DISPLAY_ENV": "VERBOSE",
                 "RLX_CACHE_DIR": os.environ.get("RLX_CACHE_DIR", str(tmp_path / "cache")), **env})
    proc = subprocess.run([sys.executable, "-c", CHILD], env=full, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _spincount(proc: subprocess.CompletedProcess[str]) -> str:
    m = re.search(r"GOMP_SPINCOUNT = '(\d+)'", proc.stderr)
    if m is None:
        pytest.skip("the OpenMP runtime is not libgomp (no GOMP_SPINCOUNT in OMP_DISPLAY_ENV)")
    return m.group(1)


def test_config_knob():
    assert Config.from_env({}).omp_wait == "adaptive"
    assert Config.from_env({"RLX_OMP_WAIT": "200000"}).omp_wait == "200000"
    assert Config.from_env({"RLX_OMP_WAIT": "passive"}).omp_wait == "passive"
    assert Config.from_env({"RLX_OMP_WAIT": " Default "}).omp_wait == "default"
    assert Config.from_env({"RLX_OMP_WAIT": "2000"}).omp_wait == "2000"
    with pytest.raises(RlxError, match="RLX_OMP_WAIT must be adaptive, passive, active, default or a spin count"):
        Config.from_env({"RLX_OMP_WAIT": "sleepy"})
    assert omp_environment("active") == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert omp_environment("adaptive") == {"GOMP_SPINCOUNT": "200000"}


def test_libgomp_loads_with_the_bounded_spin_policy(tmp_path):
    proc = _child(tmp_path)
    # libgomp arrives with the first generated library, after RLX set the variable: it read the count.
    assert "GOMP_BEFORE_LOAD False AFTER True" in proc.stdout
    assert "ENV None 200000" in proc.stdout
    assert "POLICY True True" in proc.stdout  # spinning, and the team sized per run (RLX_OMP_WAIT=adaptive)
    assert _spincount(proc) == "200000"


@pytest.mark.parametrize(("env", "spin", "seen", "policy"), [
    ({"RLX_OMP_WAIT": "default"}, "300000", "ENV None None", "POLICY True False"),  # libgomp's own default
    ({"RLX_OMP_WAIT": "200000"}, "200000", "ENV None 200000", "POLICY True False"),  # the spin, team fixed
    ({"RLX_OMP_WAIT": "5000"}, "5000", "ENV None 5000", "POLICY False False"),
    ({"RLX_OMP_WAIT": "passive"}, "0", "ENV PASSIVE None", "POLICY False False"),
    ({"GOMP_SPINCOUNT": "77"}, "77", "ENV None 77", "POLICY False False"),  # the user's setting wins
    ({"OMP_WAIT_POLICY": "active", "RLX_OMP_WAIT": "passive"}, None, "ENV active None", "POLICY True False"),
])
def test_other_policies_and_user_settings(tmp_path, env, spin, seen, policy):
    proc = _child(tmp_path, **env)
    assert seen in proc.stdout
    assert policy in proc.stdout  # what the runtime passes the kernels (rlx_set_team), and no governor
    if spin is not None:
        assert _spincount(proc) == spin
    else:
        assert "OMP_WAIT_POLICY = 'ACTIVE'" in proc.stderr


def test_exit_while_openmp_threads_spin(tmp_path):
    """With spinning (ACTIVE) threads still inside libgomp, interpreter exit used to unmap the library
    under them (SIGSEGV); libraries are loaded RTLD_NODELETE now."""
    for _ in range(2):
        proc = _child(tmp_path, OMP_WAIT_POLICY="ACTIVE")
        assert proc.returncode == 0


@pytest.mark.parametrize(("env", "spins"), [
    ({}, 1),  # the OpenMP runtime's own default spins
    ({"GOMP_SPINCOUNT": "200000"}, 1),  # RLX's default
    ({"GOMP_SPINCOUNT": "300k"}, 1),
    ({"GOMP_SPINCOUNT": "infinite"}, 1),
    ({"GOMP_SPINCOUNT": "2000"}, 0),  # asleep before the next kernel
    ({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "200000"}, 0),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, 1),
])
def test_team_spins_reads_the_policy_like_libgomp(env, spins):
    """The quantized and int8 kernels split small products only over a spinning team: the runtime
    decides it (and passes it with each run, rlx_set_team) reading OMP_WAIT_POLICY and GOMP_SPINCOUNT
    the way libgomp does."""
    assert openmp_spins(env) == bool(spins)
