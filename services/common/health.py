"""A service's health over its stores: GetHealth's details and the grpc.health.v1 readiness.

A health probe is a blocking function (it pings a store) answering details with a `status`
(`ok`, or `down` with the reason in another detail). `SharedProbe` runs it on a worker thread
for GetHealth, shared by the calls meanwhile and cut to the caller's deadline; `watch_probe`
makes a server's services NOT_SERVING while it says `down` (a readiness probe asking for them
takes the replica out), the server's own status ("", which liveness asks) staying SERVING.
Retrieval and ToolsProxy answer their health this way (docs/architecture.md §13).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from grpc_health.v1.health_pb2 import HealthCheckResponse

from services.common import errors
from services.common.context import call_timeout, detached_context
from services.common.server import RunningServer

log = logging.getLogger("visior.health")

Probe = Callable[[], dict[str, str]]
"""A health probe: details with `status` (`ok` or `down`); it may raise a ServiceError."""

DOWN = "down"

HEALTH_PROBE_WAIT_S = 10.0
"""The longest a GetHealth waits for the health probe (a store's ping, an index's state), cut
to end before the caller's deadline: past it the answer is "down"."""

PROBE_EVERY_S = 5.0
"""How often `watch_probe` asks the probe whether the services can serve."""


class SharedProbe:
    """GetHealth's answer from a blocking probe, off the event loop (a slow or hung store must
    not hold every call while it answers). Calls while a probe runs share its answer, so a hung
    store holds one worker thread, not one a call; each waits its own deadline, and a probe not
    done by then answers "down" with `hung` as the reason (the caller, a balancer's probe behind
    a 5 s route timeout, hears why before its deadline, not the sidecar's 504)."""

    def __init__(self, probe: Probe, hung: str = "the store hangs") -> None:
        self._probe = probe
        self._hung = hung
        self._probing: asyncio.Future[dict[str, str]] | None = None

    async def details(self) -> dict[str, str]:
        """The probe's details (a copy), `status` included."""
        if self._probing is None or self._probing.done():
            # Without the deadline of the call that started it: calls meanwhile share its
            # answer, each waiting its own deadline (a short one must not cut the store's
            # ping short for a caller with a longer one).
            run = detached_context().run
            self._probing = asyncio.ensure_future(asyncio.to_thread(run, self._probe))
        wait = call_timeout(HEALTH_PROBE_WAIT_S)
        try:
            return dict(await asyncio.wait_for(asyncio.shield(self._probing), wait))
        except TimeoutError:
            return {"status": DOWN, "probe": f"no answer within {wait:.1f} s: {self._hung}"}


async def watch_probe(running: RunningServer, probe: Probe, every_s: float | None = None) -> None:
    """The grpc.health.v1 status of `running`'s services follows `probe`, asked every `every_s`
    (default PROBE_EVERY_S): a `down` answer or a ServiceError is NOT_SERVING, until cancelled.
    The server's own status ("") stays SERVING: a liveness probe asks that one, and a restart
    does not bring a store back. Once the server stops, the health servicer keeps NOT_SERVING
    whatever this sets."""
    every_s = PROBE_EVERY_S if every_s is None else every_s
    serving: bool | None = None  # not yet set by this watcher
    while True:
        try:
            answer = await asyncio.to_thread(detached_context().run, probe)
            ok, why = answer.get("status") == "ok", answer
        except errors.ServiceError as exc:
            ok, why = False, {"error": exc.message}
        if ok != serving:
            if serving is not None or not ok:
                if ok:
                    log.warning("serving: the stores answer again")
                else:
                    log.warning("not serving: a store is down", extra={"health": why})
            serving = ok
            status = HealthCheckResponse.SERVING if ok else HealthCheckResponse.NOT_SERVING
            for name in running.service_names:
                await running.health.set(name, status)
        await asyncio.sleep(every_s)
