"""The deadline of a call to a mesh neighbour ends before its caller's: the inner deadline
fires first, so the service answers its caller (a tool error, an error naming the
neighbour) instead of both timing out at one instant."""

from __future__ import annotations

import time

import pytest

from services.common.context import CALLER_MARGIN_S, HOP_MARGIN_SHARE, call_timeout, deadline_var


def _with_left(left: float | None, configured: float) -> float:
    token = deadline_var.set(None if left is None else time.monotonic() + left)
    try:
        return call_timeout(configured)
    finally:
        deadline_var.reset(token)


def test_without_a_callers_deadline_the_configured_timeout_applies() -> None:
    assert _with_left(None, 5.0) == 5.0


def test_a_configured_timeout_well_inside_the_callers_deadline_applies() -> None:
    assert _with_left(60.0, 5.0) == 5.0


@pytest.mark.parametrize("left", [5.0, 10.0, 30.0])
def test_a_hop_as_long_as_its_callers_time_ends_the_full_margin_before_it(left: float) -> None:
    # The LLM's 5 s for a tool call and ToolsProxy's 5 s for its search: the search ends first.
    assert _with_left(left, left) == pytest.approx(left - CALLER_MARGIN_S, abs=0.01)


@pytest.mark.parametrize("left", [1.0, 0.5, 0.1])
def test_a_short_callers_deadline_keeps_a_share_of_its_time_as_the_margin(left: float) -> None:
    assert _with_left(left, 5.0) == pytest.approx(left * (1 - HOP_MARGIN_SHARE), abs=0.01)


def test_a_passed_deadline_leaves_no_time() -> None:
    assert _with_left(-1.0, 5.0) == 0.0
