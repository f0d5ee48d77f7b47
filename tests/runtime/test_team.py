"""The team governor (rlx.runtime.team): how many threads each run uses while other processes compete.

The decisions are tested on measurements fed in (a fake clock and load), so nothing here depends on
what else this machine runs; the last tests check that the generated code takes the team it is given.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.runtime import team as T
from rlx.runtime.team import TeamGovernor, WaitPolicy

ADAPTIVE = WaitPolicy(spins=True, adaptive=True, source="test")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def governor(threads: int = 2, *, load: int | None = None, cpus: int = 2,
             policy: WaitPolicy = ADAPTIVE) -> tuple[TeamGovernor, Clock]:
    clock = Clock()
    gov = TeamGovernor(threads, policy, clock=clock, usage=lambda: (0.0, 0), load=lambda: load, cpus=cpus)
    return gov, clock


def undisturbed(gov: TeamGovernor, clock: Clock, runs: int = 1, wall: float = 0.01, work: tuple[int, ...] = ()) -> None:
    for _ in range(runs):
        gov.begin(work)  # where tries start
        threads = gov.threads
        clock.now += wall
        gov.observe(threads=threads, wall=wall, cpu=threads * wall, preempted=0, work=work)
        gov._in_flight -= 1


def preempted(gov: TeamGovernor, clock: Clock, share: float = 0.5, runs: int = 1, wall: float = 0.01) -> None:
    """Runs whose threads got `share` of their cores, preempted by another process."""
    for _ in range(runs):
        gov.begin()
        threads = gov.threads
        clock.now += wall
        gov.observe(threads=threads, wall=wall, cpu=threads * wall * share, preempted=4)
        gov._in_flight -= 1


def test_an_undisturbed_team_keeps_every_thread():
    gov, clock = governor(4)
    undisturbed(gov, clock, runs=50)
    assert (gov.threads, gov.contended, gov.shrinks) == (4, False, 0)


def test_preemption_shrinks_the_team_to_the_cores_left():
    gov, clock = governor(2)
    preempted(gov, clock, share=0.5)
    assert (gov.threads, gov.contended) == (1, True)

    big, clock = governor(16, cpus=16)
    preempted(big, clock, share=0.9)  # 1.6 cores' time lost: 3-4 cores taken (a preempted thread gets half)
    assert big.contended and 11 <= big.threads <= 13
    undisturbed(big, clock, runs=5)  # the smaller team has its cores
    assert big.contended and 11 <= big.threads <= 13


def test_threads_asleep_on_their_own_are_not_contention():
    """A run whose threads sleep through a long serial stretch has CPU time well under its wall
    time, but nothing preempted it: the team stays."""
    gov, _ = governor(2)
    for _ in range(20):
        gov.observe(threads=2, wall=0.01, cpu=0.012, preempted=0)
    assert (gov.threads, gov.contended) == (2, False)


def test_one_preempted_run_in_many_is_noise():
    gov, _ = governor(2)
    for i in range(40):
        share = 0.85 if i % 10 == 0 else 1.0  # a kernel thread now and then, 15% of one run
        gov.observe(threads=2, wall=0.01, cpu=2 * 0.01 * share, preempted=1 if share < 1 else 0)
    assert gov.threads == 2


def test_no_try_while_the_load_says_the_cores_are_taken():
    gov, clock = governor(2, load=3)  # this process's thread and two others, on 2 cores
    preempted(gov, clock)
    assert gov.threads == 1
    clock.now += 10 * T.FIRST_BACKOFF_S
    preempted(gov, clock, share=0.67, runs=3 * T.MIN_RUNS_BETWEEN_TRIES)  # solo, sharing a core
    assert (gov.threads, gov.tries) == (1, 0)


def test_a_free_core_is_tried_and_kept():
    gov, clock = governor(2, load=3)
    preempted(gov, clock)
    assert gov.threads == 1
    gov._load = lambda: 1  # the other processes ended: only this one runs
    clock.now += T.FIRST_BACKOFF_S
    undisturbed(gov, clock, runs=T.MIN_RUNS_BETWEEN_TRIES)
    undisturbed(gov, clock)  # the try: two threads, undisturbed
    assert (gov.threads, gov.tries, gov.contended) == (2, 1, False)
    undisturbed(gov, clock, runs=20)
    assert gov.threads == 2


def test_a_failed_try_backs_off_and_doubles_the_wait():
    gov, clock = governor(2, load=None)  # no load figure (not Linux): tries on the clock alone
    preempted(gov, clock)
    waits = []
    for _ in range(7):
        start = clock.now
        tries = gov.tries
        while gov.tries == tries:
            # solo runs, sharing a core; the run that begins the try runs with two threads and
            # finds the other processes still there
            preempted(gov, clock, share=0.67, wall=0.01)
            assert gov.threads == 1
        waits.append(clock.now - start)
    assert waits[1] > 1.5 * waits[0] and waits[2] > 1.5 * waits[1]
    assert T.MAX_BACKOFF_S * 0.9 <= waits[-1] <= T.MAX_BACKOFF_S + 0.2  # the wait stops growing at its bound


def test_a_fixed_policy_never_changes_the_team():
    for policy in (WaitPolicy(True, False, "RLX_OMP_WAIT=200000"), WaitPolicy(False, False, "passive")):
        gov, clock = governor(2, policy=policy)
        assert gov.begin() is None  # not even measured
        gov._in_flight -= 1
        preempted(gov, clock, runs=10)
        assert gov.threads == 2 and not gov.active


def test_overlapping_runs_are_not_measured():
    """Process CPU time covers every thread: while two runs overlap, neither's share is known."""
    gov, clock = governor(2)
    usage = iter([(0.0, 0), (100.0, 99)])
    gov._usage = lambda: next(usage)
    first = gov.begin()
    second = gov.begin()
    assert first is not None and second is None
    gov.end(second)
    clock.now += 0.01
    gov.end(first)  # another run ended inside it: not measured (in flight > 0 when it ended? no: measured
    # only when it is the last one in flight, and `begin` refused the overlapping one)
    assert gov.threads == 2 and gov._in_flight == 0


def test_resize_starts_again_at_full_size():
    gov, clock = governor(4, cpus=4)
    preempted(gov, clock, share=0.5)
    assert gov.threads < 4
    gov.resize(3)
    assert (gov.threads, gov.contended, gov.max_threads) == (3, False, 3)


def test_load_average_reads_the_runnable_count(tmp_path):
    path = tmp_path / "loadavg"
    path.write_text("0.42 0.23 0.10 3/88 6275\n")
    assert T.LoadAverage(str(path))() == 3
    assert T.LoadAverage(str(tmp_path / "missing"))() is None
    path.write_text("garbage\n")
    assert T.LoadAverage(str(path))() is None


# ── the generated code takes the team it is given ──────────────────────────────────────────────


def _profiled_graph() -> rlx.CompiledGraph:
    g = rlx.Graph("team_probe")
    x = g.input("x", [512, 256])
    g.set_outputs([g.activation("gelu", g.matmul(x, g.param("w", [256, 256])))])
    cg = rlx.Session(profile=True).compile(g, num_threads=2)
    cg.set_param("w", np.full((256, 256), 0.01, np.float32))
    return cg


def test_runs_use_the_governors_team():
    cg = _profiled_graph()
    assert cg.team is not None and cg.team.max_threads == 2
    x = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)
    h = (x @ np.full((256, 256), 0.01, np.float32)).astype(np.float64)
    want = h * 0.5 * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0)))

    cg.team.policy = WaitPolicy(spins=True, adaptive=False, source="test")  # hold the team where it is set
    cg.team.threads = 2
    (two,) = cg.run(x=x)
    threads_two = {s.thread for s in cg.trace(clear=True) if s.thread >= 0}
    cg.team.threads = 1
    (one,) = cg.run(x=x)
    threads_one = {s.thread for s in cg.trace(clear=True) if s.thread >= 0}
    np.testing.assert_allclose(two, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(one, want, rtol=1e-4, atol=1e-5)
    assert threads_two == {0, 1}
    assert threads_one == {0}


def test_a_team_that_does_not_spin_claims_tasks_and_computes_the_same():
    """Without spinning (passive waiting, or contended cores) a packed GEMM's tiles and an attention's (row, head)
    tasks are claimed one at a time instead of taken in fixed ranges (kernels/threads.h rlx_tasks): both threads
    take part, and the result is bit for bit the spinning team's."""
    g = rlx.Graph("team_claims")
    x = g.input("x", [4, 128, 256])  # 512 x 256 x 256 GEMMs: big enough for both threads
    qkv = [g.matmul(x, g.param(n, [256, 256])) for n in ("wq", "wk", "wv")]
    g.set_outputs([g.attention(*qkv, num_heads=4, head_dim=64, mask="causal")])
    cg = rlx.Session(profile=True).compile(g, num_threads=2)
    rng = np.random.default_rng(1)
    params = {n: (rng.standard_normal((256, 256)) * 0.05).astype(np.float32) for n in ("wq", "wk", "wv")}
    for n, w in params.items():
        cg.set_param(n, w)
    feed = {"x": rng.standard_normal((4, 128, 256)).astype(np.float32)}
    cg.team.threads = 2
    cg.team.policy = WaitPolicy(spins=True, adaptive=False, source="test")  # hold the team where it is set
    (spinning,) = cg.run(**feed)
    cg.run(x=np.zeros_like(feed["x"]))  # other values in the arena: a task left undone would show
    cg.trace(clear=True)
    cg.team.policy = WaitPolicy(spins=False, adaptive=False, source="test")
    (claimed,) = cg.run(**feed)
    assert cg._pool.primary.team == (2, False)  # what the run passed to rlx_set_team
    spans = [s for s in cg.trace(clear=True) if s.thread >= 0]
    for kind in ("matmul", "attention"):
        assert {s.thread for s in spans if s.kind == kind} == {0, 1}, kind
    np.testing.assert_array_equal(claimed, spinning)
    np.testing.assert_allclose(claimed, reference.run(g, feed, params)[0], rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("threads", [0, -3, 99])
def test_set_team_clamps_to_the_reserved_count(threads):
    cg = _profiled_graph()
    ctx = cg._pool.primary
    got = cg._lib.rlx_set_team(ctx.ptr, threads, 1)
    assert got == max(1, min(threads, 2))


def test_the_full_team_returns_at_once_when_the_load_says_the_cores_are_free():
    """Short runs (1x16 embeddings: ~3 ms) must not spend many runs at the reduced size once the
    other processes are gone: the first run after the load figure shows free cores tries the team."""
    gov, clock = governor(2, load=3)
    preempted(gov, clock, wall=0.003)
    assert gov.threads == 1
    preempted(gov, clock, share=0.67, runs=20, wall=0.003)
    assert gov.tries == 0
    gov._load = lambda: 1
    undisturbed(gov, clock, wall=0.003)  # read the load within LOAD_CHECK_S: this very run tries
    undisturbed(gov, clock, runs=3, wall=0.003)
    assert (gov.threads, gov.tries) == (2, 1)


def test_a_misleading_load_figure_backs_off():
    """A container may see its host's task count: when the figure said "free" and the try found the
    cores taken, the next tries wait out a growing backoff."""
    gov, clock = governor(2, load=1)  # says free, always
    preempted(gov, clock)
    assert gov.threads == 1
    starts = []
    for _ in range(5):
        tries = gov.tries
        while gov.tries == tries:
            preempted(gov, clock, share=0.67, wall=0.01)  # each try is preempted too
        starts.append(clock.now)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps[0] >= 2 * T.FIRST_BACKOFF_S * 0.9 and gaps[1] > 1.5 * gaps[0] and gaps[2] > 1.5 * gaps[1]


def test_a_long_run_meeting_a_kernel_thread_is_not_contention():
    """A 200 ms run on a quiet machine meets a few involuntary switches (kernel threads, timers) while its
    threads also sleep through a serial stretch: not preemption by another process."""
    gov, _ = governor(2)
    for _ in range(10):
        gov.observe(threads=2, wall=0.2, cpu=0.3, preempted=3)
    assert (gov.threads, gov.contended) == (2, False)
    gov.observe(threads=2, wall=0.2, cpu=0.2, preempted=60)  # 300 switches a second: another process
    # (a 200 ms work has long regions: it leaves the spinning full team for the oversized one, LONG_WORK_S)
    assert (gov.threads, gov.contended) == (gov.oversized, True)


# ── under contention, the faster size wins: long GEMM-heavy runs keep the full team's share ─────────────


def timed(gov: TeamGovernor, clock: Clock, walls: dict[int, float], runs: int = 1, share: float = 0.5,
          work: tuple[int, ...] = (8, 128), shares: dict[int, float] | None = None) -> list[int]:
    """Runs beside busy processes (preempted, each thread getting `share` of a core, or `shares[t]` with t
    threads) that take `walls[t]` seconds with t threads; returns the team size of each run."""
    sizes = []
    for _ in range(runs):
        gov.begin(work)
        threads = gov.threads
        wall = walls[threads]
        clock.now += wall
        cpu = threads * wall * (shares or {}).get(threads, share)
        gov.observe(threads=threads, wall=wall, cpu=cpu, preempted=int(wall * 1000), work=work)
        gov._in_flight -= 1
        sizes.append(threads)
    return sizes


def test_a_try_that_runs_faster_though_preempted_keeps_the_full_team():
    """The load figure showed free cores, but the try of the full team was preempted (a container that sees its
    host's tasks, a competitor that came back): it still ran the work faster than the reduced team, so the governor
    keeps it (and says why); preemption does not shrink it, only a faster probe of the reduced size would."""
    load = [4]
    clock = Clock()
    gov = TeamGovernor(2, ADAPTIVE, clock=clock, usage=lambda: (0.0, 0), load=lambda: load[0], cpus=2)
    walls = {2: 0.0060, 1: 0.0090}
    timed(gov, clock, walls, runs=3)
    assert gov.threads == 1  # preemption shrank the team first
    load[0] = 1  # the figure says the cores are free
    clock.now += T.LOAD_CHECK_S
    sizes = timed(gov, clock, walls, runs=400)
    assert gov.threads == 2 and gov.contended and gov.kept_for_speed and gov.tries == 1
    assert sizes[-20:].count(2) >= 18  # the later runs use the full team (an occasional probe of one thread)
    assert not gov.forks_cheap and "still ran faster" in gov.describe()


def test_short_runs_beside_busy_processes_stay_at_one_thread():
    """A decode step: hundreds of forks, each waiting for a preempted partner; the full team is many
    times slower, so it is never probed while the load figure shows the cores taken."""
    gov, clock = governor(2, load=4)
    walls = {2: 0.100, 1: 0.008, 3: 0.150}
    timed(gov, clock, walls)
    sizes = timed(gov, clock, walls, runs=3000, work=(1, 64))  # 24 s of decoding
    assert gov.threads == 1 and not gov.kept_for_speed
    assert sizes.count(1) == len(sizes)  # never a probe of the spinning full team, nor of the oversized one
    assert gov.tries == 0  # no try: the load figure never showed a free core


def test_a_full_team_kept_for_speed_goes_back_when_the_small_team_becomes_faster():
    gov, clock = governor(2, load=4)
    timed(gov, clock, {2: 0.060, 1: 0.090, 3: 0.075}, runs=40)
    assert gov.kept_for_speed
    timed(gov, clock, {2: 0.200, 1: 0.050, 3: 0.250}, runs=60)  # the work changed character (or the load did)
    assert gov.threads == 1 and gov.contended and not gov.kept_for_speed


def test_a_full_team_kept_for_speed_ends_the_contention_when_it_runs_undisturbed():
    gov, clock = governor(2, load=4)
    timed(gov, clock, {2: 0.060, 1: 0.090, 3: 0.075}, runs=40)
    assert gov.kept_for_speed
    undisturbed(gov, clock, runs=3, wall=0.03)  # the busy processes ended
    assert (gov.threads, gov.contended, gov.kept_for_speed) == (2, False, False)
    assert gov.forks_cheap


def test_probes_compare_only_runs_of_the_same_work():
    """Times of different shapes say nothing about team sizes: a probe waits for runs of its own work."""
    gov, clock = governor(2, load=4)
    timed(gov, clock, {2: 0.060, 1: 0.090, 3: 0.075}, work=(8, 128))
    clock.now += 10 * T.FIRST_BACKOFF_S
    timed(gov, clock, {2: 0.060, 1: 0.090, 3: 0.075}, work=(1, 16))  # one run of another shape: nothing to compare yet
    assert gov.probes == 0 and gov.threads == 1


# ── one thread more than the cores: libgomp's threads then wait passively, with a bigger share ───────────


def test_an_oversized_team_exists_only_where_the_team_fills_the_cores_and_spins():
    assert governor(2, cpus=2)[0].oversized == 3
    assert governor(2, cpus=4)[0].oversized is None  # cores to spare: the full team is never oversubscribed
    assert governor(1, cpus=1)[0].oversized is None
    passive = WaitPolicy(spins=False, adaptive=True, source="test")
    assert governor(2, cpus=2, policy=passive)[0].oversized is None  # its threads sleep already


def test_long_runs_beside_busy_processes_take_the_oversized_team_when_it_is_fastest():
    """MiniLM 8x128 beside two busy processes: a spinning full team wastes its share at the barriers, while
    three threads that wait passively hold more of the machine than passive's two; the probes find it."""
    gov, clock = governor(2, load=5)
    walls = {1: 0.090, 2: 0.085, 3: 0.055}
    sizes = timed(gov, clock, walls, runs=60)
    assert gov.threads == 3 and gov.contended and gov.kept_for_speed and not gov.forks_cheap
    assert sizes[-20:].count(3) >= 17  # an occasional probe of one or two threads
    assert "one thread more than the cores" in gov.describe()


def test_the_oversized_team_gives_way_to_the_full_team_when_the_cores_come_free():
    load = [5]
    clock = Clock()
    gov = TeamGovernor(2, ADAPTIVE, clock=clock, usage=lambda: (0.0, 0), load=lambda: load[0], cpus=2)
    timed(gov, clock, {1: 0.090, 2: 0.085, 3: 0.055}, runs=60)
    assert gov.threads == 3
    load[0] = 3  # the busy processes ended: only this process's three threads are runnable
    clock.now += 1.0
    undisturbed(gov, clock, runs=3, wall=0.03)
    assert (gov.threads, gov.contended, gov.kept_for_speed) == (2, False, False) and gov.forks_cheap


def test_a_full_team_that_meets_contention_again_after_the_oversized_one_shrinks():
    load = [5]
    clock = Clock()
    gov = TeamGovernor(2, ADAPTIVE, clock=clock, usage=lambda: (0.0, 0), load=lambda: load[0], cpus=2)
    timed(gov, clock, {1: 0.090, 2: 0.085, 3: 0.055}, runs=60)
    load[0] = 3
    clock.now += 1.0
    undisturbed(gov, clock, runs=3, wall=0.03)
    load[0] = 4
    preempted(gov, clock, runs=2)  # busy again: preemption shrinks the full team as before
    assert gov.threads == 1 and gov.contended and gov.threads <= gov.max_threads


def test_an_oversized_team_reserves_its_scratch_and_computes_the_same():
    """The generated code runs a team of one thread more than the context reserved scratch for: the
    runtime reserves it on first use, every thread takes part, and the result equals the full team's."""
    cg = _profiled_graph()
    x = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)
    cg.team.policy = WaitPolicy(spins=True, adaptive=False, source="test")  # hold the team where it is set
    cg.team.threads = 2
    (two,) = cg.run(x=x)
    cg.trace(clear=True)
    cg.team.threads = cg.team.oversized = 3
    (three,) = cg.run(x=x)
    assert {s.thread for s in cg.trace(clear=True) if s.thread >= 0} == {0, 1, 2}
    np.testing.assert_allclose(three, two, rtol=1e-5, atol=1e-6)
    assert cg._lib.rlx_set_team(cg._pool.primary.ptr, 3, 0) == 3  # scratch for three is reserved now


def test_short_runs_never_probe_the_oversized_team():
    """A 1x16 embedding (a few ms): an oversized team's forks each wake sleeping threads, so it is not tried."""
    gov, clock = governor(2, load=5)
    sizes = timed(gov, clock, {1: 0.004, 2: 0.009, 3: 0.002}, runs=2000, work=(1, 16))
    assert 3 not in sizes and gov.probes == 0  # nor the spinning full team: no other size to compare


def test_the_first_run_takes_the_cores_the_load_figure_shows_free():
    """A warm start beside busy processes: its first run must not be a spinning full team (hundreds of ms
    waiting for preempted partners) before any run was measured."""
    busy, _ = governor(2, load=3)  # the calling thread and two busy loops
    assert busy.begin() is not None and busy.threads == 1 and busy.contended
    quiet, _ = governor(2, load=1)  # only the calling thread
    assert quiet.begin() is not None and quiet.threads == 2 and not quiet.contended
    unknown, _ = governor(2, load=None)  # no load figure: the full team, as before
    assert unknown.begin() is not None and unknown.threads == 2


def test_the_load_figure_is_read_only_where_the_process_may_use_every_cpu():
    """Pinned to some cores (taskset, a cpuset), the machine-wide runnable count says nothing about them."""
    assert isinstance(T.machine_load(4, online=4), T.LoadAverage)
    assert T.machine_load(2, online=16)() is None


# ── long runs (few long regions: MiniLM 8x128) under contention: the oversized team at once, few probes ─────────

#: MiniLM 8x128 on 2 cores beside two busy processes, as RLX_TEAM_TRACE showed it (ms): the spinning full team
#: wastes its share at every barrier, one thread gets a third of the machine, three passive threads the most.
BUSY_8X128 = {1: 0.550, 2: 0.650, 3: 0.350}


def quiet_then(busy_load: int | None, wall: float = 0.150) -> tuple[TeamGovernor, Clock]:
    """A governor whose work ran undisturbed on the full team (`wall` seconds, work 8x128) before the load figure
    started to show `busy_load` runnable tasks (None: no figure, as for a process pinned to some cores)."""
    load = [1]
    clock = Clock()
    gov = TeamGovernor(2, ADAPTIVE, clock=clock, usage=lambda: (0.0, 0), load=lambda: load[0], cpus=2)
    undisturbed(gov, clock, runs=3, wall=wall, work=(8, 128))
    load[0] = busy_load
    return gov, clock


def test_long_work_goes_straight_to_the_oversized_team_when_preempted():
    gov, clock = quiet_then(None)  # quiet: 150 ms runs of the full team; then busy, with no load figure to tell
    sizes = timed(gov, clock, BUSY_8X128)
    assert sizes == [2]  # the run that measured the preemption
    assert (gov.threads, gov.contended, gov.kept_for_speed) == (3, True, True) and not gov.forks_cheap
    assert gov._reduced == 1  # the size the probes compare it with

    short, clock = quiet_then(None, wall=0.005)  # a 1x16 embedding: many short regions
    timed(short, clock, {1: 0.015, 2: 0.030, 3: 0.020})
    assert (short.threads, short.contended, short.kept_for_speed) == (1, True, False)


def test_long_runs_never_probe_the_spinning_full_team_and_probe_seldom():
    """Each probe of a long work costs a whole run: beside busy processes the spinning full team is never
    probed (it would be the slowest), and probes of the reduced team space out by runs as well as time."""
    gov, clock = quiet_then(4)
    sizes = timed(gov, clock, BUSY_8X128, runs=60)
    assert 2 not in sizes  # not even the first: the load figure showed the busy processes before it
    assert gov.threads == 3 and gov.tries == 0
    assert 1 <= sizes.count(1) <= 3  # probes after 4, 8 and 16 runs at the oversized size: at most 3 in 60 runs


def test_a_long_work_whose_reduced_team_is_faster_takes_it():
    """One busy loop pinned to one of 2 cores: the reduced team has the other core to itself."""
    gov, clock = quiet_then(3)
    sizes = timed(gov, clock, {1: 0.200, 2: 0.400, 3: 0.330}, runs=40)
    assert gov.threads == 1 and sizes[-10:].count(1) >= 9 and 2 not in sizes[1:]


def test_the_load_figure_counts_only_the_calling_thread_of_an_oversized_team():
    """The oversized team's threads sleep between runs: two busy loops and the calling thread are three runnable
    tasks, so no core is free and no try of the full team starts (each would be a slow spinning run)."""
    gov, clock = quiet_then(3)
    timed(gov, clock, BUSY_8X128, runs=40)
    assert gov.threads == 3 and gov.tries == 0


def test_the_trace_says_what_each_run_was_and_what_followed(tmp_path):
    path = tmp_path / "team.log"
    gov, clock = quiet_then(None)
    gov.trace = T.team_trace({"RLX_TEAM_TRACE": str(path)})
    timed(gov, clock, BUSY_8X128, runs=12)
    lines = path.read_text().splitlines()
    assert len(lines) == 12 and all(line.startswith("pid=") for line in lines)
    assert " work=8x128 run team=2 " in lines[0] and "-> next=3 contended=1 kept_for_speed=1" in lines[0]
    # without a load figure, the full team is tried after `MIN_RUNS_BETWEEN_TRIES` runs (and fails: still busy)
    assert sum(" try team=2 " in line for line in lines) == gov.tries >= 1
    assert sum(" probe " in line for line in lines) == gov.probes
    assert T.team_trace({}) is None


def test_a_reduced_team_probed_from_the_oversized_one_is_compared_on_speed():
    """One thread beside two busy loops on 2 cores gets two thirds of a core: it loses less than `LOSS_LIMIT`,
    which must not read as free cores; it is slower than the oversized team, so the oversized team stays."""
    gov, clock = quiet_then(4)
    sizes = timed(gov, clock, BUSY_8X128, runs=30, shares={1: 0.67})
    assert gov.threads == 3 and gov.contended and gov.kept_for_speed
    assert 1 <= sizes.count(1) <= 3


def test_long_work_takes_the_oversized_team_before_a_run_the_load_figure_shows_contended():
    """A competitor that appeared while the process paused (the spinning team's threads asleep since): the load
    figure shows it before the next run, and long work starts that run on the oversized team rather than spend
    it spinning beside the competitor."""
    gov, clock = quiet_then(2)  # the calling thread and one busy loop
    clock.now += 0.2
    gov.begin((8, 128))
    assert (gov.threads, gov.contended, gov.kept_for_speed, gov._reduced) == (3, True, True, 1)

    back_to_back, clock = quiet_then(2)  # right after a run: the calling thread and its spinning partner
    back_to_back.begin((8, 128))
    assert (back_to_back.threads, back_to_back.contended) == (2, False)

    short, clock = quiet_then(2, wall=0.005)  # short work: only measured preemption shrinks its team
    clock.now += 0.2
    short.begin((8, 128))
    assert (short.threads, short.contended) == (2, False)


def test_failed_probes_do_not_hold_off_the_full_team_once_the_load_figure_shows_free_cores():
    """Probes that failed beside busy processes (a size not faster) back off the next probes, not the try the load
    figure allows when the processes end: the first run after them is the full team's."""
    load = [1]
    clock = Clock()
    gov = TeamGovernor(2, ADAPTIVE, clock=clock, usage=lambda: (0.0, 0), load=lambda: load[0], cpus=2)
    undisturbed(gov, clock, runs=3, wall=0.150, work=(8, 128))
    load[0] = 3
    timed(gov, clock, BUSY_8X128, runs=30)
    assert gov.threads == 3 and gov.probes >= 2 and gov._backoff > T.FIRST_BACKOFF_S  # probes of one thread failed
    load[0] = 1  # the busy processes ended
    clock.now += 0.2
    undisturbed(gov, clock, runs=1, wall=0.150, work=(8, 128))
    assert (gov.threads, gov.contended, gov.tries) == (2, False, 1)


def test_probes_compare_only_recent_runs():
    """Runs of the size in use from before a pause (the load may have changed since) are not compared: a probe waits
    for fresh runs of that size."""
    gov, clock = governor(2, load=4)
    walls = {1: 0.015, 2: 0.030, 3: 0.020}
    timed(gov, clock, walls, runs=40, work=(1, 16))
    assert gov.threads == 1
    clock.now += 5.0  # a pause: the runs at one thread are five seconds old
    probes = gov.probes
    sizes = timed(gov, clock, walls, runs=2, work=(1, 16))
    assert sizes == [1, 1] and gov.probes == probes


def test_short_work_never_takes_the_oversized_team_even_when_contention_lengthens_its_runs():
    """A 1x16 embedding (4.5 ms undisturbed) runs for 15 ms on one thread beside busy processes: still many short
    regions, so the oversized team (whose forks wake sleeping threads) is never a candidate."""
    load = [1]
    clock = Clock()
    gov = TeamGovernor(2, ADAPTIVE, clock=clock, usage=lambda: (0.0, 0), load=lambda: load[0], cpus=2)
    undisturbed(gov, clock, runs=3, wall=0.0045, work=(1, 16))
    load[0] = 4
    sizes = timed(gov, clock, {1: 0.015, 2: 0.060, 3: 0.012}, runs=1000, work=(1, 16))
    assert 3 not in sizes and gov.threads == 1


def test_a_try_the_load_figure_allows_gets_a_second_run():
    """The first run of the full team after one thread ran alone wakes (or creates) the other thread: it meets a
    few switches and loses time, which is not a competitor's doing. The try is judged on its second run."""
    load = [4]
    clock = Clock()
    gov = TeamGovernor(2, ADAPTIVE, clock=clock, usage=lambda: (0.0, 0), load=lambda: load[0], cpus=2)
    timed(gov, clock, {2: 0.030, 1: 0.015}, runs=3, work=(1, 16))
    assert gov.threads == 1
    load[0] = 1  # quiet again
    clock.now += 2.0
    gov.begin((1, 16))
    assert gov.threads == 2
    clock.now += 0.005
    gov.observe(threads=2, wall=0.005, cpu=0.0068, preempted=2, work=(1, 16))  # a cold first run
    gov._in_flight -= 1
    assert gov.threads == 2 and gov.tries == 1
    undisturbed(gov, clock, runs=1, wall=0.0042, work=(1, 16))
    assert (gov.threads, gov.contended, gov.tries) == (2, False, 1)

    clock.now += 2.0  # a try that fails twice falls back, and backs off further tries
    load[0] = 4
    timed(gov, clock, {2: 0.030, 1: 0.015}, runs=2, work=(1, 16))
    assert gov.threads == 1
    load[0] = 1
    clock.now += 2.0
    timed(gov, clock, {2: 0.030, 1: 0.015}, runs=2, work=(1, 16))
    assert gov.threads == 1 and gov.tries == 2 and gov._try_backoff > T.FIRST_BACKOFF_S


def test_short_undisturbed_runs_of_the_full_team_are_measured_one_in_quiet_every():
    """While the full team runs short work undisturbed, only every QUIET_EVERY-th run pays for its measurement (two
    getrusage calls and the decision's Python); a preempted measured run makes every run measured again, and the
    team shrinks on it as before."""
    gov, clock = governor(2)
    calls = []
    cpu, switches = [0.0], [0]

    def usage() -> tuple[float, int]:
        calls.append(clock.now)
        return cpu[0], switches[0]

    gov._usage = usage
    for _ in range(3 * T.QUIET_EVERY):
        ticket = gov.begin((1,))
        clock.now += 0.001
        cpu[0] += 0.002
        gov.end(ticket)
    assert len(calls) == 2 * 3  # runs 1, 1 + QUIET_EVERY, 1 + 2 QUIET_EVERY
    assert gov.threads == 2 and not gov.contended
    calls.clear()
    for _ in range(T.QUIET_EVERY):  # the next measured run is preempted: the team shrinks at once
        ticket = gov.begin((1,))
        clock.now += 0.001
        if ticket is None:
            cpu[0] += 0.002
        else:
            cpu[0] += 0.001
            switches[0] += 10
        gov.end(ticket)
        if gov.threads < 2:
            break
    assert len(calls) == 2 and gov.threads == 1 and gov.contended
    long_runs, clock2 = governor(2)
    long_runs._usage = lambda: (2 * clock2.now, 0)
    measured = 0
    for _ in range(8):  # runs longer than QUIET_MAX_S: every one measured
        ticket = long_runs.begin((8,))
        measured += ticket is not None
        clock2.now += 2 * T.QUIET_MAX_S
        long_runs.end(ticket)
    assert measured == 8
