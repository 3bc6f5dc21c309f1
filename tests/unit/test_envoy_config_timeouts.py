"""Route timeouts past Envoy's stream idle timeout (a CPU model's slow answers)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from services.common.topology import Ports
from services.devtools.envoy_config import (
    HCM_STREAM_IDLE_TIMEOUT_S,
    STREAM_IDLE,
    render,
    route_timeout,
)
from services.devtools.mesh import LOCAL_CALL_TIMEOUT_S, local_envoy_timeouts

RESPOND = "/internal/orchestrator/respond"


def _routes(timeouts: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Each path route's action by path (`_method_routes` without the method)."""
    return {
        path: action
        for (path, kind), action in _method_routes(timeouts).items()
        if kind != "prefix"
    }


def test_a_route_longer_than_the_idle_timeout_gets_its_own_idle_timeout() -> None:
    long = _routes({RESPOND: 930.0})[RESPOND]
    assert long["timeout"] == "930s" and long["idle_timeout"] == "930s"


def test_a_route_at_the_idle_timeout_keeps_envoys_default() -> None:
    at = _routes({RESPOND: HCM_STREAM_IDLE_TIMEOUT_S})[RESPOND]
    assert at["timeout"] == f"{HCM_STREAM_IDLE_TIMEOUT_S:g}s" and "idle_timeout" not in at
    assert "idle_timeout" not in _routes({})[RESPOND]


STREAM = "/internal/llm/generate:stream"


def test_the_stream_idle_timeout_is_sixty_seconds_unless_overridden() -> None:
    assert _routes({})[STREAM] == {**_routes({})[STREAM], "timeout": "0s", "idle_timeout": "60s"}
    slow = _routes({STREAM_IDLE: 315.0})[STREAM]
    assert slow["timeout"] == "0s" and slow["idle_timeout"] == "315s"
    # Only the streaming route: unary routes keep their own timeouts and no idle timeout.
    assert "idle_timeout" not in _routes({STREAM_IDLE: 315.0})[RESPOND]


def test_the_local_model_gives_a_stream_more_than_one_model_call_of_silence() -> None:
    idle = local_envoy_timeouts()[STREAM_IDLE]
    assert idle > LOCAL_CALL_TIMEOUT_S
    assert _routes(local_envoy_timeouts())[STREAM]["idle_timeout"] == f"{idle:g}s"


DOCUMENTS = "/internal/retrieval/documents"


def _method_routes(timeouts: dict[str, float]) -> dict[tuple[str, str | None], dict[str, Any]]:
    """Each path route's action by (path, the :method it matches, None for any)."""
    config = yaml.safe_load(render(Ports(), "visior.pb", timeouts=timeouts))
    out = {}
    for listener in config["static_resources"]["listeners"]:
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        for host in hcm["route_config"]["virtual_hosts"]:
            for route in host["routes"]:
                match = route["match"]
                if "path" in match:
                    headers = match.get("headers", [])
                    method = headers[0]["string_match"]["exact"] if headers else None
                    out[(match["path"], method)] = route["route"]
                elif match.get("prefix", "/") != "/":  # a service's /internal/... prefix route
                    out[(match["prefix"], "prefix")] = route["route"]
    return out


@pytest.mark.parametrize(
    "timeouts", [{}, {DOCUMENTS: 600.0}, {RESPOND: 50.0, "default": 12.0}, {"/internal/llm/x": 7.0}]
)
@pytest.mark.parametrize(
    ("path", "method"),
    [(DOCUMENTS, "POST"), (DOCUMENTS, "GET"), (RESPOND, "POST"), ("/internal/llm/x", "POST")],
)
def test_route_timeout_is_the_timeout_envoy_gives(timeouts, path, method) -> None:
    """What the CLI waits for (route_timeout) is the route Envoy takes for that request."""
    routes = _method_routes(timeouts)
    action = routes.get((path, method)) or routes.get((path, None))
    if action is None:  # Envoy's prefix route for the path takes it
        (action,) = [
            a for (p, kind), a in routes.items() if kind == "prefix" and path.startswith(p)
        ]
    assert route_timeout(path, method, timeouts) == float(action["timeout"].rstrip("s"))
