import asyncio

import pytest

from services.docstore.parsing import ChunkingConfig, parse_document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.toolsproxy.schema import SchemaError, check
from services.toolsproxy.tools import Caller, DocumentTools, ToolExecutor, ToolLimits, trim_text

TEXT = "# Guide\n\n" + "\n\n".join(f"## S{i}\n\nsection {i} text." for i in range(8))


@pytest.fixture
def executor(tmp_path):
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    cfg = ChunkingConfig(chunk_tokens=8, overlap_tokens=0)
    store.put(parse_document(tenant_id="a", doc_id="guide", text=TEXT, fmt="markdown", config=cfg))
    store.put(parse_document(tenant_id="b", doc_id="bdoc", text=TEXT, fmt="markdown", config=cfg))
    return ToolExecutor(
        DocumentTools(store, ToolLimits(max_window_radius=2, max_text_bytes=64)).tools
    )


A = Caller("a", "u1")


def run(executor, name, **args):
    return asyncio.run(executor.execute(name, args, A))


@pytest.mark.parametrize(("radius", "ok"), [(0, True), (2, True), (3, False)])
def test_window_radius_at_and_past_the_limit(executor, radius, ok):
    out = run(
        executor, "read_chunk_window", doc_id="guide", anchor_chunk_id="guide:c00003", radius=radius
    )
    if ok:
        assert out.status == "ok"
        assert len(out.result["chunk_ids"]) == 2 * radius + 1
    else:
        assert (out.status, out.error_code) == ("error", "WINDOW_TOO_LARGE")
        assert "3" in out.error_message and "2" in out.error_message


def test_asymmetric_window_and_document_edges(executor):
    out = run(executor, "read_chunk_window", doc_id="guide", anchor_chunk_id="guide:c00000",
              window_before=2, window_after=1)  # fmt: skip
    assert out.result["chunk_ids"] == ["guide:c00000", "guide:c00001"]
    out = run(executor, "read_chunk_window", doc_id="guide", anchor_chunk_id="guide:c00000",
              window_before=3, window_after=0)  # fmt: skip
    assert out.error_code == "WINDOW_TOO_LARGE"


def test_another_tenants_document_is_not_found_and_leaks_nothing(executor):
    for name, args in [
        ("read_chunk_window", {"doc_id": "bdoc", "anchor_chunk_id": "bdoc:c00000"}),
        ("read_doc_section", {"doc_id": "bdoc", "section_id": "bdoc:s001-s0"}),
        ("read_doc_metadata", {"doc_id": "bdoc"}),
    ]:
        out = asyncio.run(executor.execute(name, args, A))
        assert (out.status, out.error_code, out.result) == ("error", "NOT_FOUND", None)
        assert "section" not in out.error_message


def test_results_are_trimmed_at_a_character_boundary():
    text, cut = trim_text("жжжж", 7)  # 2 bytes per letter
    assert (text, cut) == ("жжж", True)
    assert trim_text("abc", 3) == ("abc", False)


def test_section_text_is_limited_and_marked(executor):
    meta = run(executor, "read_doc_metadata", doc_id="guide").result
    sec = meta["sections"][1]["section_id"]
    out = run(executor, "read_doc_section", doc_id="guide", section_id=sec)
    assert out.status == "ok" and len(out.result["text"].encode()) <= 64


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "arguments.doc_id is required"),
        ({"doc_id": 5}, "arguments.doc_id must be string"),
        ({"doc_id": "guide", "tenant_id": "b"}, "unknown field(s): tenant_id"),
        ({"doc_id": ""}, "must not be empty"),
    ],
)
def test_bad_arguments_are_invalid_argument_results(executor, args, message):
    out = asyncio.run(executor.execute("read_doc_metadata", args, A))
    assert (out.status, out.error_code) == ("error", "INVALID_ARGUMENT")
    assert message in out.error_message


def test_unknown_tool(executor):
    out = run(executor, "rm_rf")
    assert (out.status, out.error_code) == ("error", "NOT_FOUND")


def test_schema_integers_arrive_as_doubles_through_struct():
    assert check({"type": "integer"}, 2.0) == 2
    with pytest.raises(SchemaError):
        check({"type": "integer"}, 2.5)
    with pytest.raises(SchemaError):
        check({"type": "integer"}, True)
