"""Retrieval's ingestion limits that callers outside the service size themselves by (Envoy's
body and header limits, services/devtools/envoy_config.py): plain numbers, so reading them
imports nothing of the search stack."""

from __future__ import annotations

DEFAULT_MAX_DOCUMENT_BYTES = 32 << 20
"""The largest document IngestDocument accepts by default (RETR_MAX_DOCUMENT_BYTES)."""
