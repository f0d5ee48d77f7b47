"""How many threads each run uses, decided between runs: the team governor behind `RLX_OMP_WAIT=adaptive`.

Idle OpenMP threads that spin make a fork cost a few microseconds instead of the tens a sleeping
thread's wake-up costs (MiniLM 1x16 on 2 cores: 1.7x faster than passive waiting). But when other
processes want the cores, a spinning thread holds the core its descheduled partner needs, and every
parallel region waits a scheduler time slice for that partner: a decode step crosses hundreds of
regions, and runs 30-50x slower than with passive waiting. Spinning is only right while the team
has its cores to itself.

So with the default policy the runtime watches each run (`TeamGovernor`): the process's CPU time
against the team's wall time says how much of the run its threads spent off a core, and the
process's involuntary context switches say whether that was preemption (another runnable task took
the core) rather than a thread sleeping on its own. A team whose threads lost, together, more than
`LOSS_LIMIT` of a core's time to preemption is too big for the cores free now: the next runs use
fewer threads (on 2 cores: one, which never waits for a partner). From time to time, and only while
`/proc/loadavg`'s count of runnable tasks says a core may have come free, one run tries the bigger
team again and keeps it if it ran undisturbed; failed tries back off (up to `MAX_BACKOFF_S`).

Fewer threads is not always faster under contention: the scheduler shares a core between runnable
threads, so a team of one on 2 cores beside two busy processes gets a third of the machine, while a
passive team of two gets half. So while the cores stay contended the governor also compares sizes on the
same work (`work`: the run's dynamic dims, rounded up to powers of two): after the backoff, one run tries
another size even though the load figure says the cores are taken (a `probe`), and the size whose run was
faster by `SPEED_MARGIN` than the recent runs of the size in use (`faster_team`) is kept (`kept_for_speed`:
preemption does not shrink it, only a faster probe does, and an undisturbed run ends the contention).
Only recent runs compare (`FRESH_S`: the load may have changed since older ones), and failed probes back
off in time and in runs (a probe of a long work costs a whole run). Probes never run the spinning full
team: while the cores are taken it waits at every fork for a preempted partner (a 1x16 embedding: 270-320
ms instead of 15), and it comes back through a try once the load figure shows free cores. Under
contention the kernels are also told that forks are not cheap, so they split only products big enough to
be worth a wake-up.

A spinning full team is not the only big team: libgomp cuts its spin to about a hundred turns
while it manages more threads than the process has cores (`do_spin` against `gomp_available_cpus`),
so a team of one thread more than the cores (`oversized`) waits passively, with no restart of the
OpenMP runtime, and gets a bigger share of the machine than passive waiting's team (on 2 cores
beside two busy processes: three threads of five runnable tasks hold 1.2 cores, passive's two of
four hold 1.0, one thread 0.67). Probes compare it with the reduced size for work whose undisturbed runs
take `OVERSIZED_MIN_RUN_S` or more (its forks wake sleeping threads, which only long regions amortize).
Long work (`LONG_WORK_S`: MiniLM 8x128, few long regions) takes it at once, when preemption shrinks its
team or before a run where the load figure already shows a competitor (it runs such work about as fast on
free cores, so a false alarm costs nothing, while a spinning run beside a newcomer costs up to twice as
long). While it runs, the load figure counts only the calling thread as this process's (its other threads
sleep between runs), and once the cores are free the full team is tried and kept if it ran undisturbed.
Its scratch is reserved the first time a context runs it.

`RLX_TEAM_TRACE` (`team_trace`) writes one line per measured run: what it was (run, try, probe), its
team, times and preemption, and what the governor decided.

The decision is passed to the generated code with each run (`rlx_set_team`: thread count and
whether forks are cheap); the kernels never read the environment.

Measuring costs two `getrusage` calls and two clock reads per run (about 5 us; 20-30 us in all right after a
run of a model, the Python of the decision on caches the run flushed); runs shorter than `MIN_RUN_S` or
overlapping another run of the same graph are not measured (their CPU time is not theirs alone). While the full
team runs short work (`QUIET_MAX_S`) undisturbed, only every `QUIET_EVERY`-th run is measured: a competitor is
then noticed a few milliseconds later, and MobileNetV3-small's 1.3 ms runs lose ~20 us less on three of four.

>>> gov = TeamGovernor(2, WaitPolicy(spins=True, adaptive=True, source="test"), load=lambda: None)
>>> gov.observe(threads=2, wall=0.010, cpu=0.020, preempted=0)   # undisturbed: the team stays
>>> gov.threads
2
>>> gov.observe(threads=2, wall=0.010, cpu=0.011, preempted=3)   # half the team's time lost to preemption
>>> gov.threads, gov.contended
(1, True)
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: Runs shorter than this are not measured (a clock tick's noise would dominate).
MIN_RUN_S = 2e-4
#: A run whose team lost more than this many cores' worth of its time to preemption counts as contended
#: (measured in cores, not as a fraction: a spinning team waits for its slowest thread, so one thread
#: preempted half the time slows a team of 16 as much as a team of 2).
LOSS_LIMIT = 0.4
#: Involuntary switches per second of a run below which its lost time is not counted as preemption: a
#: contended core switches tasks every few milliseconds (hundreds a second), while on a quiet machine a
#: long run still meets a kernel thread now and then.
MIN_PREEMPTIONS_PER_S = 50.0
#: Smoothing of the per-run loss (weight of the newest run).
LOSS_WEIGHT = 0.5
#: First wait before trying a bigger team again, and its bound as failed tries double it.
FIRST_BACKOFF_S = 0.25
MAX_BACKOFF_S = 8.0
#: How often the load figure is read while the team is reduced (a pread of about 2 us: short runs may re-read it
#: soon after a moment it showed another runnable task, such as the process that just asked for the run).
LOAD_CHECK_S = 0.002
#: Runs at the reduced size between tries made without a load figure.
MIN_RUNS_BETWEEN_TRIES = 8
#: Recent run times kept per (work, team size), for comparing team sizes on the same work (few: a load that
#: changed makes older runs of the size in use say nothing about it now).
WALLS_KEPT = 4
#: Run times older than this (or than this many runs of their own length) are not compared: the load may have
#: changed since (a probe in a quiet moment against the size in use's runs beside busy processes would win).
FRESH_S = 1.0
FRESH_RUNS = 8
#: Work keys remembered (a graph with many input shapes forgets the oldest).
MAX_WORK_KEYS = 64
#: Under contention, a team size replaces the one in use only when its run was this much faster than the
#: median of the recent runs of the same work at the size in use.
SPEED_MARGIN = 0.1
#: Runs of the same work at the size in use needed before another size is compared against it.
MIN_WALLS_TO_COMPARE = 2
#: Runs of a work shorter than this (at the size in use) never probe the oversized team: each of its forks wakes
#: sleeping threads (tens of microseconds), which only long runs of few parallel regions amortize.
OVERSIZED_MIN_RUN_S = 0.010
#: A work whose undisturbed runs of the full team took this long has few, long parallel regions (MiniLM 8x128
#: on 2 cores: 150-200 ms): when preemption shrinks its team, it goes straight to the oversized team, whose
#: sleeping threads' wake-ups such regions amortize, rather than spending runs at the reduced size first.
LONG_WORK_S = 0.050
#: Runs at the size in use between probes, doubling with the backoff up to the bound: a probe of the wrong size
#: costs a whole run, which for long runs (hundreds of ms) the time backoff alone would allow every other run.
MIN_RUNS_BETWEEN_PROBES = 4
MAX_RUNS_BETWEEN_PROBES = 32
#: While the full team runs undisturbed, runs shorter than QUIET_MAX_S are measured one in QUIET_EVERY.
QUIET_EVERY = 4
QUIET_MAX_S = 0.005
#: About how long the adaptive policy's idle threads spin (GOMP_SPINCOUNT=200000) before they sleep.
SPIN_S = 0.001
#: libgomp's spin count below which its idle threads are asleep before the next kernel starts.
SPINNING_SPINCOUNT = 10_000


@dataclass(frozen=True)
class WaitPolicy:
    """How the process's OpenMP threads wait, fixed when the OpenMP runtime loaded.

    `spins`: idle threads spin (forks are cheap); `adaptive`: RLX's governor sizes each run's team;
    `source`: the setting it came from, for `rlxc doctor`.
    """

    spins: bool
    adaptive: bool
    source: str


def openmp_spins(env: Mapping[str, str]) -> bool:
    """Whether libgomp's idle threads spin long enough to span the gap between two kernels, read from
    OMP_WAIT_POLICY and GOMP_SPINCOUNT the way libgomp reads them (no variable: its default spins).

    >>> openmp_spins({}), openmp_spins({"GOMP_SPINCOUNT": "2000"}), openmp_spins({"GOMP_SPINCOUNT": "300k"})
    (True, False, True)
    >>> openmp_spins({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "200000"})
    False
    """
    policy = env.get("OMP_WAIT_POLICY", "").strip()
    if policy[:1] in ("a", "A"):
        return True
    if policy[:1] in ("p", "P"):
        return False
    spins = env.get("GOMP_SPINCOUNT", "").strip()
    if not spins:
        return True
    if spins[:1] in ("i", "I"):  # "infinite" / "infinity"
        return True
    digits = len(spins) - len(spins.lstrip("0123456789"))
    if digits == 0:
        return True  # libgomp ignores a malformed count and keeps its own (spinning) default
    count = int(spins[:digits])
    suffix = spins[digits:].strip()[:1].lower()
    count *= {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(suffix, SPINNING_SPINCOUNT)
    return count >= SPINNING_SPINCOUNT


def cpus_available() -> int:
    """The cores this process may run on (its affinity mask; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def work_key(sym_values: Sequence[int]) -> tuple[int, ...]:
    """A run's dynamic dims rounded up to powers of two: runs of about the same work share a key, so
    their times compare (a decode step's cache length grows by one a step).

    >>> work_key([3, 100]), work_key([1]), work_key([])
    ((4, 128), (1,), ())
    """
    return tuple(1 << max(0, int(v) - 1).bit_length() for v in sym_values)


def faster_team(candidate: float, incumbent: Sequence[float], margin: float = SPEED_MARGIN) -> bool | None:
    """Whether one run of `candidate` seconds at another team size beats the size in use, whose recent runs
    of the same work took `incumbent` seconds, by `margin` of their median; None with too few runs to tell.

    >>> faster_team(0.060, [0.090, 0.095, 0.088])  # MiniLM 8x128 beside busy processes: the full team's share
    True
    >>> faster_team(0.120, [0.007, 0.008])  # a decode step: each of its forks waits for a preempted partner
    False
    >>> faster_team(0.087, [0.090, 0.095])  # within the margin: noise, not a reason to change
    False
    >>> faster_team(0.060, [0.090]) is None
    True
    """
    if len(incumbent) < MIN_WALLS_TO_COMPARE:
        return None
    ordered = sorted(incumbent)  # the median (the statistics module costs a warm start decimal and fractions)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return candidate < (1.0 - margin) * median


class LoadAverage:
    """The machine's count of runnable tasks right now (`/proc/loadavg`'s fourth field), or None.

    Read with one `pread` of a kept-open file (about 2 us). Inside a container it may count the
    host's tasks: the governor only uses it to skip tries that would surely fail.
    """

    def __init__(self, path: str = "/proc/loadavg") -> None:
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> int | None:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return None

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


def _no_figure() -> int | None:
    return None


def machine_load(cpus: int, online: int | None = None) -> Callable[[], int | None]:
    """The load figure the governor reads: `/proc/loadavg`'s runnable count where this process may run on every
    online CPU, else none (tries then follow the backoff alone).

    The count is the whole machine's: beside a process pinned to 2 of 16 cores (taskset, a container's cpuset)
    it counts the tasks on the other 14, so it would say the pinned cores are taken while they are free, and
    free while they are taken.

    >>> machine_load(2, online=16)() is None
    True
    """
    online = online if online is not None else (os.cpu_count() or 1)
    return LoadAverage() if cpus >= online else _no_figure


def team_trace(env: Mapping[str, str]) -> Callable[[str], None] | None:
    """Where governors write one line per measured run (`RLX_TEAM_TRACE`: a file appended to, or `-` for
    stderr), or None when unset. For finding out why a team size was chosen; off by default.

    >>> team_trace({}) is None, callable(team_trace({"RLX_TEAM_TRACE": "-"}))
    (True, True)
    """
    target = env.get("RLX_TEAM_TRACE", "").strip()
    if not target:
        return None
    pid = os.getpid()
    if target == "-":
        import sys

        def to_stderr(line: str) -> None:
            print(f"rlx team pid={pid} {line}", file=sys.stderr, flush=True)

        return to_stderr

    def to_file(line: str) -> None:
        with open(target, "a", encoding="utf-8") as out:  # appended whole: processes may share the file
            out.write(f"pid={pid} {line}\n")

    return to_file


def _usage() -> tuple[float, int]:
    """(CPU seconds of every thread of the process, involuntary context switches so far)."""
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_nivcsw


class TeamGovernor:
    """Chooses the thread count of each run of one compiled graph (see the module docstring).

    `threads` is what the next run uses; `begin` / `end` bracket a run and feed `observe`. With a
    policy that is not adaptive (or one thread at most) the team is always `max_threads`. `tries` counts
    bigger teams tried because the load figure showed free cores (or, without one, on the clock),
    `probes` the other size tried under contention to compare speeds.
    """

    def __init__(self, max_threads: int, policy: WaitPolicy, *, clock: Callable[[], float] = time.perf_counter,
                 usage: Callable[[], tuple[float, int]] = _usage, load: Callable[[], int | None] | None = None,
                 cpus: int | None = None, trace: Callable[[str], None] | None = None) -> None:
        self.policy = policy
        #: Where each measured run and decision is written (`RLX_TEAM_TRACE`, `team_trace`), or None.
        self.trace = trace
        self.max_threads = max(1, int(max_threads))
        self.threads = self.max_threads
        self.contended = False
        #: Smoothed cores' worth of the team's time lost to preemption per run (0: undisturbed).
        self.loss = 0.0
        #: One thread more than the cores (passive waiting with a bigger share; module docstring), or None
        #: where the team does not fill the cores or its idle threads sleep anyway.
        self.oversized: int | None = None
        self.tries = 0
        self.probes = 0
        self.shrinks = 0
        #: The full team is in use under contention because it ran faster than the reduced one.
        self.kept_for_speed = False
        self._clock = clock
        self._usage = usage
        self._cpus = cpus if cpus is not None else cpus_available()
        self._load = load if load is not None else machine_load(self._cpus)
        self._backoff = FIRST_BACKOFF_S  # before the next probe (or try without a load figure)
        self._changed_at = clock()
        self._checked_at = -LOAD_CHECK_S
        self._failed_at = -MAX_BACKOFF_S  # when a probe (or a try without a load figure) last failed
        # A try the load figure allowed that failed (the figure misled) holds off the next such try: a backoff
        # of its own, which failed probes (a size not faster under contention) say nothing about.
        self._try_backoff = FIRST_BACKOFF_S
        self._try_failed_at = -MAX_BACKOFF_S
        self._by_figure = False  # whether the try under way is one the load figure allowed
        self._try_grace = False  # whether that try may run once more before it counts as failed
        self._load_missing = False
        self._runs_since_change = 0
        self._trying: int | None = None  # the size to return to if the current try (or probe) fails
        self._trial = "run"  # what the measured run is: "run", "try" or "probe" (for the trace)
        self._reduced: int | None = None  # the size contention shrank the team to (a size probes compare)
        self._probed_at: dict[int, float] = {}  # size -> when a probe last tried it
        # work -> size -> (end, seconds) of its recent runs
        self._walls: dict[tuple[int, ...], dict[int, deque[tuple[float, float]]]] = {}
        self._undisturbed: dict[tuple[int, ...], float] = {}  # work -> its last undisturbed run of the full team
        self._in_flight = 0
        self._quiet = 0  # runs left to run unmeasured (QUIET_EVERY)
        self._ended_at = -math.inf  # when the last measured run ended
        self._started = False  # whether a run began (the first one sizes its team from the load figure)
        self._lock = threading.Lock()
        self._size_oversized()

    @property
    def active(self) -> bool:
        """Whether this governor ever changes the team (adaptive policy, more than one thread)."""
        return self.policy.adaptive and self.max_threads > 1

    def _size_oversized(self) -> None:
        fills = self.max_threads > 1 and self.max_threads >= self._cpus
        self.oversized = self.max_threads + 1 if self.policy.spins and fills else None

    @property
    def forks_cheap(self) -> bool:
        """What the kernels are told with the team: idle threads spin and have their cores, so a fork costs
        microseconds and small products are worth splitting (not while other processes take the cores)."""
        return self.policy.spins and not self.contended

    def resize(self, max_threads: int) -> None:
        """A new thread bound (the graph's `num_threads` changed): start again at full size."""
        with self._lock:
            self.max_threads = max(1, int(max_threads))
            self.threads = self.max_threads
            self._size_oversized()
            self._started = False
            self.contended = False
            self.kept_for_speed = False
            self.loss = 0.0
            self._trying = None
            self._quiet = 0
            self._reduced = None
            self._probed_at.clear()
            self._walls.clear()
            self._undisturbed.clear()
            self._backoff = self._try_backoff = FIRST_BACKOFF_S
            self._changed_at = self._clock()
            self._runs_since_change = 0

    def begin(self, work: tuple[int, ...] = ()) -> tuple[int, float, float, int, tuple[int, ...]] | None:
        """Before a run of `work` (`work_key` of its dynamic dims): (threads, wall, cpu, switches, work) to
        pass to `end`, or None when not measured."""
        with self._lock:
            self._in_flight += 1
            if not self.active or self._in_flight > 1:
                return None
            if not self._started:
                self._first_team()
            self._maybe_try(work)
            threads = self.threads
            if self._quiet > 0 and self._trying is None and threads == self.max_threads and not self.contended:
                self._quiet -= 1  # a short run of the undisturbed full team: not measured (QUIET_EVERY)
                return None
        cpu, switches = self._usage()
        return threads, self._clock(), cpu, switches, work

    def end(self, ticket: tuple[int, float, float, int, tuple[int, ...]] | None) -> None:
        """After a run (also a failed one): measure it if `begin` said so."""
        if ticket is not None:
            wall = self._clock() - ticket[1]
            cpu, switches = self._usage()
        with self._lock:
            self._in_flight -= 1
            if ticket is not None and self._in_flight == 0:
                self._observe(ticket[0], wall, cpu - ticket[2], switches - ticket[3], ticket[4])
            elif ticket is None and self._in_flight == 0 and self.active:
                self._ended_at = self._clock()  # a run left unmeasured: the team's threads spin from here

    def observe(self, *, threads: int, wall: float, cpu: float, preempted: int, work: tuple[int, ...] = ()) -> None:
        """Feed one run's measurement: its team size, wall and CPU seconds, involuntary switches, work key."""
        with self._lock:
            self._observe(threads, wall, cpu, preempted, work)

    # ── the decisions (called with the lock held) ──────────────────────

    def _observe(self, threads: int, wall: float, cpu: float, preempted: int, work: tuple[int, ...] = ()) -> None:
        if not self.active or wall < MIN_RUN_S or threads != self.threads:
            return
        # Time off a core counts only when something preempted the team: a thread asleep on its own
        # (a serial stretch longer than the spin) is not contention.
        contended = preempted >= max(1.0, wall * MIN_PREEMPTIONS_PER_S)
        lost = threads * min(1.0, max(0.0, 1.0 - cpu / (threads * wall))) if contended else 0.0
        trial, self._trial = self._trial if self._trying is not None else "run", "run"
        self._ended_at = self._clock()
        self._decide(threads, wall, lost, work, by_figure=trial == "try" and self._by_figure)
        quiet = (threads == self.threads == self.max_threads and lost == 0.0 and not self.contended
                 and self._trying is None and wall < QUIET_MAX_S)
        self._quiet = QUIET_EVERY - 1 if quiet else 0
        if self.trace is not None:
            self.trace(f"t={self._clock():.3f} work={'x'.join(map(str, work)) or '-'} "
                       f"{trial} team={threads} wall_ms={wall * 1e3:.2f} "
                       f"cpu_ms={cpu * 1e3:.2f} switches={preempted} lost={lost:.2f} loss={self.loss:.2f} "
                       f"-> next={self.threads} contended={int(self.contended)} "
                       f"kept_for_speed={int(self.kept_for_speed)} backoff_s={self._backoff:g}")

    def _decide(self, threads: int, wall: float, lost: float, work: tuple[int, ...], *,
                by_figure: bool = False) -> None:
        """What one measured run of `threads` threads, `wall` seconds long that lost `lost` cores' worth of its
        time to preemption, changes: the size in use, contention, the backoffs (`by_figure`: the run was a try
        the load figure allowed)."""
        self._runs_since_change += 1
        if threads == self.max_threads and lost <= LOSS_LIMIT:
            if work not in self._undisturbed and len(self._undisturbed) >= MAX_WORK_KEYS:
                del self._undisturbed[next(iter(self._undisturbed))]
            self._undisturbed[work] = wall
        if self._trying is not None:  # one run at another size (a try or a probe)
            fallback, self._trying = self._trying, None
            faster = faster_team(wall, self._walls_of(work, fallback))
            self._remember(work, threads, wall)
            # A team within the cores, bigger than a reduced one, or the full team tried from an oversized one,
            # that ran undisturbed: the cores are free. (A smaller team than the one in use can run undisturbed
            # on a contended machine: one thread beside two busy loops loses a third of a core, under the
            # limit; only its speed says whether it beats an oversized team.)
            cores_free = lost <= LOSS_LIMIT and threads <= self.max_threads and (
                threads > fallback or (fallback > self.max_threads and threads == self.max_threads))
            if cores_free:
                self.loss = lost
                self.contended = threads < self.max_threads
                self.kept_for_speed = False
                if not self.contended:
                    self._reduced = None
                self._backoff = self._try_backoff = FIRST_BACKOFF_S
            elif faster:  # still contended, but this size ran the same work faster
                self.loss = lost
                self.contended = True
                if self._reduced is None or threads < self._reduced:
                    self._reduced = min(threads, fallback)
                self.kept_for_speed = threads > self._reduced
                self._backoff = FIRST_BACKOFF_S
            elif by_figure and self._try_grace:
                # The first run of a bigger team wakes, or creates, the threads a smaller team released: its
                # switches and lost time say little. The try gets a second run (still while the figure allowed it).
                self._try_grace = False
                self._trying, self._trial = fallback, "try"
            elif by_figure:
                self._set(fallback)
                self._try_failed_at = self._clock()
                self._try_backoff = min(MAX_BACKOFF_S, self._try_backoff * 2)
            else:
                self._set(fallback)
                self._failed_at = self._clock()
                self._backoff = min(MAX_BACKOFF_S, self._backoff * 2)
            return
        self._remember(work, threads, wall)
        self.loss = LOSS_WEIGHT * lost + (1 - LOSS_WEIGHT) * self.loss
        if self.kept_for_speed:
            # Preemption does not shrink a team kept for its speed (only a faster probe does); the
            # contention ends when the team runs undisturbed again.
            if lost <= LOSS_LIMIT and self.loss <= LOSS_LIMIT:
                self.kept_for_speed = False
                if threads > self.max_threads:
                    self._set(self.max_threads)
                self.contended = self.threads < self.max_threads
                self._reduced = None
            return
        if threads > 1 and (self.loss > LOSS_LIMIT or lost > 2 * LOSS_LIMIT):
            # The cores the team did not get: each preempted thread got about half of its core.
            busy = max(1, math.ceil(2 * max(lost, self.loss)))
            reduced = max(1, min(threads, self.max_threads) - busy)
            if self.oversized is not None and threads <= self.max_threads and self._long(work):
                # Few long regions: the oversized team's bigger share at once (probes compare the reduced one).
                self._set(self.oversized)
                self.kept_for_speed = True
            else:
                self._set(reduced)
            self._reduced = reduced
            self.contended = True
            self.shrinks += 1
        elif threads == self.max_threads:
            self.contended = False
            self._reduced = None

    def _long(self, work: tuple[int, ...]) -> bool:
        """Whether the full team's last undisturbed run of `work` took `LONG_WORK_S` or more."""
        return self._undisturbed.get(work, 0.0) >= LONG_WORK_S

    def _walls_of(self, work: tuple[int, ...], threads: int) -> list[float]:
        """The recent run times of `work` at `threads` that still say something: those that ended within
        `FRESH_S` (or `FRESH_RUNS` of their own length) of now, before the load could change."""
        now = self._clock()
        return [wall for end, wall in self._walls.get(work, {}).get(threads, ())
                if now - end <= max(FRESH_S, FRESH_RUNS * wall)]

    def _remember(self, work: tuple[int, ...], threads: int, wall: float) -> None:
        sizes = self._walls.get(work)
        if sizes is None:
            if len(self._walls) >= MAX_WORK_KEYS:
                del self._walls[next(iter(self._walls))]  # the key seen first
            sizes = self._walls[work] = {}
        sizes.setdefault(threads, deque(maxlen=WALLS_KEPT)).append((self._clock(), wall))

    def _set(self, threads: int) -> None:
        self.threads = threads
        self.loss = 0.0
        self._changed_at = self._clock()
        self._runs_since_change = 0

    def _maybe_try(self, work: tuple[int, ...] = ()) -> None:
        """Between runs under contention: try the full team when a core may have come free, or probe
        another size on this work.

        A reduced team (or an oversized one) reads the load figure at most every `LOAD_CHECK_S`; a try
        starts as soon as it says enough cores are free (the next size up from a reduced team, the full
        team from an oversized one), unless a try it allowed failed within the backoff (the figure
        misled: a container may see its host's tasks). Without a figure, tries follow the backoff alone.
        While the cores are taken (and always for a full team kept for its speed), a probe runs the
        size tried least recently among the reduced, full and oversized ones, once the size in use has
        run this work `MIN_WALLS_TO_COMPARE` times and the backoff has passed.
        """
        if self._trying is not None:
            return
        now = self._clock()
        if not (self.contended or self.kept_for_speed):
            self._foresee(work, now)
            return
        if self.threads != self.max_threads and not (self.kept_for_speed and self.threads < self.max_threads):
            want = (self.max_threads if self.threads > self.max_threads
                    else min(self.max_threads, self.threads + max(1, self.threads // 2)))
            if now - self._checked_at >= LOAD_CHECK_S:
                self._checked_at = now
                running = self._load()
            else:
                running = None if self._load_missing else -1  # -1: not read this time
            if running == -1:
                return
            if running is None:
                self._load_missing = True
                if self._runs_since_change >= MIN_RUNS_BETWEEN_TRIES and now - self._changed_at >= self._backoff:
                    self._start_try(want, now, probe=False)
                return
            # This process's team counts among the runnable tasks (a spinning team's threads are awake between
            # runs; an oversized team's sleep at once, leaving the calling thread), the others hold the rest.
            ours = 1 if self.threads > self.max_threads else self.threads
            free = self._cpus - max(0, running - ours)
            if free >= want:
                if now - self._try_failed_at >= self._try_backoff:
                    self._start_try(want, now, probe=False, by_figure=True)
                return
        if self._may_probe(work, now):
            size = self._next_probe(work)
            if size is not None:
                self._probed_at[size] = now
                self._start_try(size, now, probe=True)

    def _foresee(self, work: tuple[int, ...], now: float) -> None:
        """Before a run of long work (`LONG_WORK_S`) on the spinning full team: where the load figure shows other
        runnable tasks on the team's cores, take the oversized team now. Its passive threads run such work about
        as fast on free cores, while a spinning team beside a competitor would spend a whole slow run (a third
        to twice longer) before its preemption was measured."""
        if self.oversized is None or self.threads != self.max_threads or not self._long(work):
            return
        if now - self._checked_at < LOAD_CHECK_S:
            return
        self._checked_at = now
        running = self._load()
        if running is None:
            return
        # The spinning team's threads are awake just after a run; after a pause only the calling thread is.
        ours = self.threads if now - self._ended_at < SPIN_S else 1
        free = self._cpus - max(0, running - ours)
        if free >= self.max_threads or now - self._try_failed_at < self._try_backoff:
            return
        self._set(self.oversized)
        self._reduced = max(1, free)
        self.contended = True
        self.kept_for_speed = True
        self.shrinks += 1

    def _first_team(self) -> None:
        """Before the first run: a team of the cores the load figure shows free. A spinning team's first run
        beside busy processes (a warm start's first embedding) would otherwise wait a time slice for a
        preempted partner at every fork (300-600 ms instead of 15 on 2 cores) before any run was measured."""
        self._started = True
        running = self._load()
        if running is None:
            return
        free = self._cpus - max(0, running - 1)  # the runnable tasks other than this calling thread
        if free < self.max_threads:
            self._set(max(1, free))
            self._reduced = self.threads
            self.contended = True
            self.shrinks += 1
            self._checked_at = self._clock()

    def _next_probe(self, work: tuple[int, ...]) -> int | None:
        """The size a probe compares next: of the reduced and oversized sizes other than the one in use, the one
        probed least recently; the oversized one only for long runs.

        Never the spinning full team: probes run while the load figure says the cores are taken, and there a
        spinning team waits at every fork for a preempted partner (a 1x16 embedding beside two busy processes on
        2 cores: 270-320 ms instead of 15; MiniLM 8x128: twice the oversized team's time), so its probe costs a
        slow run and hardly ever wins. It comes back through a try once the figure shows the cores free."""
        # How long the work's runs are: its undisturbed full team's time where known (under contention every
        # size runs it slower, and a 1x16 embedding would pass for long work), else the size in use's.
        walls = self._walls_of(work, self.threads)
        length = self._undisturbed.get(work, min(walls, default=0.0))
        oversized = self.oversized if length >= OVERSIZED_MIN_RUN_S else None
        sizes = [s for s in (oversized, self._reduced) if s is not None and s != self.threads]
        if not sizes:
            return None
        return min(dict.fromkeys(sizes), key=lambda s: self._probed_at.get(s, -math.inf))

    def _may_probe(self, work: tuple[int, ...], now: float) -> bool:
        runs = min(MAX_RUNS_BETWEEN_PROBES, round(MIN_RUNS_BETWEEN_PROBES * self._backoff / FIRST_BACKOFF_S))
        return (len(self._walls_of(work, self.threads)) >= MIN_WALLS_TO_COMPARE and self._runs_since_change >= runs
                and now - self._changed_at >= self._backoff and now - self._failed_at >= self._backoff)

    def _start_try(self, threads: int, now: float, *, probe: bool, by_figure: bool = False) -> None:
        self._by_figure = self._try_grace = by_figure
        if probe:
            self.probes += 1
        else:
            self.tries += 1
        self._trial = "probe" if probe else "try"
        self._trying = self.threads
        self.threads = threads
        self._changed_at = now
        self._runs_since_change = 0

    def describe(self) -> str:
        """One line for timings and `rlxc doctor`.

        >>> TeamGovernor(4, WaitPolicy(True, True, "x"), load=lambda: None).describe()
        '4 of 4 threads, cores free'
        """
        state = "other processes compete for the cores" if self.contended else "cores free"
        if self.kept_for_speed and self.threads > self.max_threads:
            state += " (one thread more than the cores ran faster: libgomp's threads then wait passively)"
        elif self.kept_for_speed:
            state += " (the full team still ran faster)"
        if not self.active:
            state = "fixed team" if self.max_threads > 1 else "one thread"
        return f"{self.threads} of {self.max_threads} threads, {state}"


def contention_note(team: TeamGovernor | None) -> str:
    """A clause for a timing line when the runs timed shared the cores with other processes, else "".

    >>> gov = TeamGovernor(2, WaitPolicy(True, True, "x"), load=lambda: None)
    >>> contention_note(gov)
    ''
    >>> gov.observe(threads=2, wall=0.010, cpu=0.011, preempted=3)
    >>> contention_note(gov)
    '; other processes took the cores: ran on 1 of 2 threads (rlxc doctor shows the load)'
    """
    if team is None or team.shrinks == 0:
        return ""
    return (f"; other processes took the cores: ran on {team.threads} of {team.max_threads} threads "
            "(rlxc doctor shows the load)")


__all__ = ["LoadAverage", "TeamGovernor", "WaitPolicy", "contention_note", "cpus_available", "faster_team",
           "machine_load", "openmp_spins", "team_trace", "work_key"]
