"""What keeps a service from starting while none of its settings is wrong."""

from __future__ import annotations


class DependencyUnavailableError(Exception):
    """A dependency the service opens (a store, an index, an embedding backend) cannot be
    reached now, or another process holds it: no setting is wrong, and a restart may succeed.

    Raised while starting, `services.common.runner.run_service` reports it as one "cannot
    start" line and exits 1, as it does for a port it cannot listen on (ListenError). A
    service's own error class derives from it (with or without a base of its own), so the
    runner catches it without importing the service."""
