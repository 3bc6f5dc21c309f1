"""IndexOptimizer: optimize once writes have paused, once at start, never mid-burst or twice."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.common.settings import Env, SettingsError
from services.retrieval.config import RetrievalSettings
from services.retrieval.index_maintenance import IndexOptimizer
from tests.fakes.clock import ManualClock


class FakeIndex:
    def __init__(self, *, fail: bool = False, block: threading.Event | None = None) -> None:
        self.write_count = 0
        self.optimized_at: list[int] = []
        self.fail = fail
        self.block = block

    def optimize(self) -> None:
        if self.block is not None:
            self.block.wait(5)
        self.optimized_at.append(self.write_count)
        if self.fail:
            raise RuntimeError("disk full")


async def _step(opt: IndexOptimizer) -> bool:
    """One poll: run an optimize when due; whether one ran."""
    if opt.due():
        await opt.run_once()
        return True
    return False


async def test_runs_once_at_start_after_the_quiet_period_then_only_after_new_writes() -> None:
    index, clock = FakeIndex(), ManualClock()
    opt = IndexOptimizer(index, quiet_s=10, clock=clock)
    assert not await _step(opt)  # just opened: not quiet long enough yet
    clock.now += 9.9
    assert not await _step(opt)
    clock.now += 0.1
    assert await _step(opt)  # what an earlier process left unoptimised
    clock.now += 100
    assert not await _step(opt)  # nothing written since: no second run
    assert index.optimized_at == [0] and opt.runs == 1


async def test_a_burst_of_writes_is_optimised_once_after_it_ends() -> None:
    index, clock = FakeIndex(), ManualClock()
    opt = IndexOptimizer(index, quiet_s=10, clock=clock)
    clock.now += 10
    assert await _step(opt)
    for _ in range(20):  # a write every 5 s: never quiet for 10
        index.write_count += 1
        clock.now += 5
        assert not await _step(opt)
    clock.now += 9.99
    assert not await _step(opt)  # the last write was seen 9.99 s ago
    clock.now += 0.01
    assert await _step(opt)
    assert index.optimized_at == [0, 20]


async def test_an_ingest_in_progress_keeps_it_from_starting() -> None:
    index, clock, ingesting = FakeIndex(), ManualClock(), [True]
    opt = IndexOptimizer(index, quiet_s=10, clock=clock, busy=lambda: ingesting[0])
    for _ in range(5):  # a long document still embedding: no writes, but not quiet either
        clock.now += 10
        assert not await _step(opt)
    ingesting[0] = False
    clock.now += 9.99
    assert not await _step(opt)
    clock.now += 0.01
    assert await _step(opt)


async def test_a_failed_optimize_is_logged_and_retried_after_the_next_quiet_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    index, clock = FakeIndex(fail=True), ManualClock()
    opt = IndexOptimizer(index, quiet_s=10, clock=clock)
    clock.now += 10
    assert await _step(opt)
    assert "disk full" in opt.last_error and opt.details()["optimize_error"] == opt.last_error
    assert any("optimize failed" in r.getMessage() for r in caplog.records)
    clock.now += 5
    assert not await _step(opt)
    clock.now += 5
    index.fail = False
    assert await _step(opt)
    assert opt.last_error == "" and "optimize_error" not in opt.details()
    assert opt.runs == 2


async def test_the_loop_runs_it_in_the_background_and_stop_does_not_wait() -> None:
    release = threading.Event()
    index = FakeIndex(block=release)
    opt = IndexOptimizer(index, quiet_s=0.02, poll_s=0.01)
    opt.start()
    try:
        for _ in range(200):
            if opt.running:
                break
            await asyncio.sleep(0.01)
        assert opt.running and opt.details()["optimizing"] == "true"
        await opt.stop()  # returns while the optimize still runs
        assert opt.running
    finally:
        release.set()
    for _ in range(200):
        if not opt.running:
            break
        await asyncio.sleep(0.01)
    assert index.optimized_at == [0] and opt.details()["optimizing"] == "false"


async def test_a_start_up_run_covers_what_is_there_and_the_loop_waits_for_new_writes() -> None:
    index, clock = FakeIndex(), ManualClock()
    index.write_count = 0
    opt = IndexOptimizer(index, quiet_s=10, clock=clock)
    opt.run_blocking()
    assert index.optimized_at == [0] and opt.runs == 1 and not opt.running
    clock.now += 100
    assert not await _step(opt)  # nothing written since the start-up run
    index.write_count += 1
    clock.now += 1
    assert not await _step(opt)
    clock.now += 10
    assert await _step(opt)
    assert index.optimized_at == [0, 1]


def test_quiet_period_must_be_positive() -> None:
    with pytest.raises(ValueError):
        IndexOptimizer(FakeIndex(), quiet_s=0)


def test_setting_default_off_and_limits() -> None:
    assert RetrievalSettings.from_env(Env({})).index.optimize_quiet_s == 10.0
    assert (
        RetrievalSettings.from_env(Env({"RETR_OPTIMIZE_QUIET_S": "0"})).index.optimize_quiet_s == 0
    )
    at_limit = RetrievalSettings.from_env(Env({"RETR_OPTIMIZE_QUIET_S": "86400"}))
    assert at_limit.index.optimize_quiet_s == 86400
    for bad in ("-1", "86401", "soon"):
        with pytest.raises(SettingsError, match="RETR_OPTIMIZE_QUIET_S"):
            RetrievalSettings.from_env(Env({"RETR_OPTIMIZE_QUIET_S": bad}))
