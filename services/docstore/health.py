"""The document store's part of a service's health answer (services/common/health.py)."""

from __future__ import annotations

from services.docstore.store import DocumentStore


def store_health(store: DocumentStore) -> dict[str, str]:
    """`{"status": "ok", "docstore": <kind>}`, or `{"status": "down", "docstore": "error: <why>"}`
    when the store does not answer its ping (blocking: call it from a worker thread). The
    reason is the store's error, whose location is masked (no password)."""
    try:
        store.ping()
    except Exception as exc:  # the health answer must say why, not raise
        return {"status": "down", "docstore": f"error: {exc}"}
    return {"status": "ok", "docstore": store.kind}
