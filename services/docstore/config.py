"""Where the document store lives: one rule for every service that opens it."""

from __future__ import annotations

from pathlib import Path

from services.common.settings import Env, SettingsError


def docstore_path(env: Env, prefix: str) -> str:
    """The SQLite path from <prefix>DOCSTORE_URL / METADATA_DB_URL (sqlite:///…) or VISIOR_DATA_DIR."""
    found = env.raw([prefix + "DOCSTORE_URL", "METADATA_DB_URL"])
    if found is None:
        return str(Path(env.text("VISIOR_DATA_DIR", "data")) / "docstore.sqlite")
    name, url = found
    if url.startswith("sqlite:///"):
        return url.removeprefix("sqlite:///") or ":memory:"
    raise SettingsError(f"{name}={url!r}: only sqlite:///PATH is supported so far")
