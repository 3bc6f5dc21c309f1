"""Retrieval's health probe answers the document store's part as ToolsProxy's does
(services/docstore/health.store_health): "down" with the store's error, else its kind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from services.docstore.sqlite_store import SqliteDocumentStore
from services.retrieval.app import _health_probe


class DownStore(SqliteDocumentStore):
    def ping(self) -> None:
        raise OSError("disk gone")


def probe(store: Any) -> dict[str, str]:
    stack = SimpleNamespace(backend="edge", reranker_kind="none", index=None)
    settings = SimpleNamespace(production=False)
    return _health_probe(settings, store, stack)()  # type: ignore[arg-type]


def test_a_store_that_does_not_answer_is_down_with_its_error(tmp_path):
    store = DownStore(tmp_path / "docstore.sqlite")
    assert probe(store) == {
        "status": "down", "backend": "edge", "docstore": "error: disk gone", "reranker": "none"
    }  # fmt: skip


def test_a_store_that_answers_is_named_by_its_kind_and_none_in_mock_mode(tmp_path):
    assert probe(SqliteDocumentStore(tmp_path / "docstore.sqlite"))["docstore"] == "sqlite"
    assert probe(None) == {
        "status": "ok", "backend": "edge", "docstore": "none", "reranker": "none",
        "production": "false",
    }  # fmt: skip
