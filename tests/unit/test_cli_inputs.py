"""What the visior CLI does with its inputs: files of one run that retrieval would store as
one are refused before anything is sent, a server that takes a request and does not answer
in time is not called unreachable, and flags the services could not use are argparse
errors."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import services.cli.main as cli
from services.common.search_contract import KB_TENANT
from services.docstore.kb_csv import kb_file_key, read_knowledge_base_csv
from services.retrieval.ingestion import IngestInput, Ingestor
from services.retrieval.listing import MAX_PAGE_SIZE

# --- files retrieval would store as one --------------------------------------------------------


def _tree(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n\ntext of {name}\n", encoding="utf-8")
    return root


def _ingest(
    monkeypatch: pytest.MonkeyPatch, paths: list[Path], tenant: str = "acme"
) -> tuple[int, list[str]]:
    """`ingest` against a sidecar that answers every document; the file names it was sent."""
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["file_name"]
        sent.append(name)
        return httpx.Response(200, json={"doc_id": name})

    real = httpx.Client
    monkeypatch.setattr(
        cli.httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    return cli.ingest("http://sidecar", [str(p) for p in paths], tenant, 5.0), sent


def test_one_name_in_two_folders_stops_the_run_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _tree(tmp_path / "tree", "a/readme.md", "b/readme.md", "c/other.md")
    rc, sent = _ingest(monkeypatch, [tree])
    assert (rc, sent) == (2, [])
    err = capsys.readouterr().err
    assert f"document 'readme': {tree / 'a/readme.md'}, {tree / 'b/readme.md'}" in err
    assert "rename" in err and "separately" in err and "other.md" not in err


def test_names_the_service_makes_one_doc_id_of_clash_across_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The doc_id is slugified: case, the suffix and punctuation do not tell files apart.
    _tree(tmp_path, "x/Read Me.MD", "y/read_me.txt")
    rc, sent = _ingest(monkeypatch, [tmp_path / "x", tmp_path / "y/read_me.txt"])
    assert (rc, sent) == (2, [])
    assert "document 'read-me'" in capsys.readouterr().err


def test_one_file_named_twice_is_no_clash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree(tmp_path / "tree", "a/readme.md", "b/other.md")
    rc, sent = _ingest(monkeypatch, [tree, tree / "a/readme.md"])
    assert rc == 0 and sorted(sent) == ["other.md", "readme.md", "readme.md"]


def test_two_knowledge_base_csvs_of_one_name_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kb = _tree(tmp_path / "kb", "2024/x.csv", "2025/x.csv")
    rc, sent = _ingest(monkeypatch, [kb], KB_TENANT)
    assert (rc, sent) == (2, [])
    err = capsys.readouterr().err
    assert f"knowledge-base CSV 'x.csv': {kb / '2024/x.csv'}, {kb / '2025/x.csv'}" in err
    assert "deletes the articles" in err


def test_knowledge_base_csvs_are_told_apart_by_their_name_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = _tree(tmp_path / "kb", "2024/x.csv", "2025/X.csv")
    rc, sent = _ingest(monkeypatch, [kb], KB_TENANT)
    assert rc == 0 and sorted(sent) == ["X.csv", "x.csv"]


def test_csvs_a_tenant_skips_do_not_clash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree(tmp_path / "tree", "2024/x.csv", "2025/x.csv", "a.md")
    assert _ingest(monkeypatch, [tree]) == (0, ["a.md"])


_KB_HEADER = "id,title,content,topic,jurisdiction,updated_at,tags\n"


def _kb_csv(path: Path, *ids: str, date: str = "2025-01-10") -> Path:
    """A knowledge-base CSV at `path` holding one article per id."""
    rows = "".join(f"{i},About {i},The text of {i}.,tax,RU,{date},tax\n" for i in ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_KB_HEADER + rows, encoding="utf-8")
    return path


def test_knowledge_base_csvs_sharing_an_article_id_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Retrieval stores an article under an id made from its row's id, whatever its CSV: the
    # second file's "vat" would replace the first's, and "2 of 2 ingested" store one article.
    a = _kb_csv(tmp_path / "kb_2025.csv", "vat", "ndfl")
    b = _kb_csv(tmp_path / "kb_2026.csv", "VAT", "usn")
    rc, sent = _ingest(monkeypatch, [a, b], KB_TENANT)
    assert (rc, sent) == (2, [])
    err = capsys.readouterr().err
    assert f"article 'kb-vat': {a}, {b}" in err
    assert "ndfl" not in err and "usn" not in err and "different ids" in err


def test_a_document_of_an_article_id_stops_a_knowledge_base_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kb = _kb_csv(tmp_path / "kb.csv", "vat")
    doc = _tree(tmp_path, "KB VAT.md") / "KB VAT.md"
    rc, sent = _ingest(monkeypatch, [kb, doc], KB_TENANT)
    assert (rc, sent) == (2, [])
    assert f"article 'kb-vat': {kb}, {doc}" in capsys.readouterr().err


def test_many_shared_article_ids_are_shown_in_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [f"a{n:02d}" for n in range(30)]
    rc, sent = _ingest(
        monkeypatch,
        [_kb_csv(tmp_path / "x.csv", *ids), _kb_csv(tmp_path / "y.csv", *ids)],
        KB_TENANT,
    )
    assert (rc, sent) == (2, [])
    err = capsys.readouterr().err
    assert "article 'kb-a19'" in err and "article 'kb-a20'" not in err
    assert "and 10 more article ids" in err


def test_knowledge_base_csvs_of_distinct_article_ids_are_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = tmp_path / "kb"
    _kb_csv(kb / "kb_2025.csv", "vat", "ndfl")
    _kb_csv(kb / "kb_2026.csv", "vat-2026", "usn")
    _tree(kb, "notes.md")
    rc, sent = _ingest(monkeypatch, [kb], KB_TENANT)
    assert rc == 0 and sorted(sent) == ["kb_2025.csv", "kb_2026.csv", "notes.md"]


def test_one_knowledge_base_csv_named_twice_is_no_article_clash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = _kb_csv(tmp_path / "kb.csv", "vat")
    assert _ingest(monkeypatch, [kb, kb], KB_TENANT) == (0, ["kb.csv", "kb.csv"])


@pytest.mark.parametrize(
    "broken",
    [
        "id,title\nvat,VAT rate\n",  # required columns missing: the file is refused
        _KB_HEADER + "vat,VAT rate,text,tax,RU,not a date,tax\n",  # a bad row: refused whole
        _KB_HEADER + "vat,VAT rate,text,tax,RU,2025-01-10,tax\nvat,Again,text,tax,RU,2025-01-10,\n",
        b"\xff\xfe\x00id\x00",  # not text
    ],
)
def test_a_csv_retrieval_would_refuse_is_no_article_clash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str | bytes
) -> None:
    # Retrieval stores nothing of a CSV it refuses, so its ids replace nothing: it is sent,
    # and refused there with the reason, as any broken CSV is.
    good = _kb_csv(tmp_path / "good.csv", "vat")
    bad = tmp_path / "bad.csv"
    if isinstance(broken, bytes):
        bad.write_bytes(broken)
    else:
        bad.write_text(broken, encoding="utf-8")
    assert cli.clashes([good, bad], KB_TENANT) == {}
    assert _ingest(monkeypatch, [good, bad], KB_TENANT) == (0, ["good.csv", "bad.csv"])


def test_the_cli_reads_article_ids_as_the_service_stores_them(tmp_path: Path) -> None:
    kb = _kb_csv(tmp_path / "Мой файл.csv", "vat", "НДФЛ 2025", "a.b")
    parsed = read_knowledge_base_csv(kb.read_bytes(), KB_TENANT, file_name=kb_file_key(kb.name))
    assert cli.article_ids(kb) == [d.doc_id for d in parsed.strict()]


@pytest.mark.parametrize(
    "name",
    ["readme.md", "Read Me.MD", "отчёт 2024.pdf", "a.b.c.txt", "..md", "a\\b.md", "x" * 150 + ".md",
     "ÉTÉ.md", "notes.log"],
)  # fmt: skip
def test_the_cli_derives_the_doc_id_the_service_does(name: str) -> None:
    service = SimpleNamespace(_max_bytes=1 << 20)
    try:
        doc_id, fmt = Ingestor._validate(service, IngestInput("acme", b"x", file_name=name))  # type: ignore[arg-type]
    except Exception:
        doc_id = ""  # refused: nothing is stored under any id
    else:
        doc_id = "" if fmt == "unknown" else doc_id
    assert cli.stored_as(name, "acme") == (f"document {doc_id!r}" if doc_id else "")


@pytest.mark.parametrize("name", ["x.csv", "X.CSV", "a\\x.csv", "Мой файл.csv"])
def test_the_cli_keys_a_knowledge_base_csv_as_the_service_does(name: str) -> None:
    assert cli.stored_as(name, KB_TENANT) == f"knowledge-base CSV {kb_file_key(name)!r}"
    assert cli.stored_as(name, "acme") == ""


# --- a server that takes the request and does not answer --------------------------------------


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A listener whose connections the kernel completes and nobody ever answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A port held without a listener: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_ask_says_no_answer_not_cannot_reach(
    silent_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ask", "q", "--url", silent_url, "--timeout", "0.2"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: no answer from the orchestrator at {silent_url} within 0.2 s "
        "(the request may still be processed there)\n"
    )


def test_list_says_no_answer_not_cannot_reach(
    silent_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["list", "--tenant", "acme", "--url", silent_url, "--timeout", "0.2"]) == 1
    err = capsys.readouterr().err
    assert f"no answer from retrieval at {silent_url} within 0.2 s" in err
    assert "cannot reach" not in err


def test_an_unanswered_document_is_to_be_ingested_again(
    silent_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _tree(tmp_path, "a.md") / "a.md"
    argv = ["ingest", str(doc), "--tenant", "acme", "--url", silent_url, "--timeout", "0.2"]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert "failed" not in out
    assert f"no answer from retrieval at {silent_url} within 0.2 s" in out
    assert "retrieval stops an ingest its caller leaves before its write" in out
    assert f"visior list --tenant acme --url {silent_url}" in out
    assert "ingest the others again with a longer --timeout" in out


def test_a_refused_connection_is_still_cannot_reach(
    refused_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ask", "q", "--url", refused_url, "--timeout", "5"]) == 1
    assert f"cannot reach the orchestrator at {refused_url}" in capsys.readouterr().err
    doc = _tree(tmp_path, "a.md") / "a.md"
    assert cli.main(["ingest", str(doc), "--tenant", "acme", "--url", refused_url]) == 1
    out = capsys.readouterr().out
    assert "a.md failed:" in out and "not answered in time" not in out


# --- flags --------------------------------------------------------------------------------------

COMMANDS = {
    "ask": ["ask", "q"],
    "ingest": ["ingest", "x.md", "--tenant", "acme"],
    "list": ["list", "--tenant", "acme"],
}


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What each client command was called with, instead of calling the mesh."""
    calls: dict[str, Any] = {}

    def command(*args: Any, **options: Any) -> int:  # ask and ingest: the timeout comes last
        calls["timeout"] = args[-1]
        return 0

    monkeypatch.setattr(cli, "ask", command)
    monkeypatch.setattr(cli, "ingest", command)

    def list_documents(url: str, tenant: str, timeout: float, page_size: int) -> int:
        calls.update(timeout=timeout, page_size=page_size)
        return 0

    monkeypatch.setattr(cli, "list_documents", list_documents)
    return calls


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("value", ["0", "-0", "-1", "nan", "inf", "-inf", "1e309", "soon", ""])
def test_a_timeout_that_is_no_positive_finite_number_is_refused(
    command: str, value: str, seen: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*COMMANDS[command], f"--timeout={value}"])
    assert exit_.value.code == 2 and seen == {}
    assert "argument --timeout:" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("value", ["5e-324", "1.7976931348623157e308", "0.5"])
def test_the_smallest_and_largest_finite_timeouts_are_taken(
    command: str, value: str, seen: dict[str, Any]
) -> None:
    assert cli.main([*COMMANDS[command], "--timeout", value]) == 0
    assert seen["timeout"] == float(value)


@pytest.mark.parametrize("value", ["0", "-1", str(MAX_PAGE_SIZE + 1), "1.5", "ten"])
def test_a_page_size_the_listing_refuses_is_refused(
    value: str, seen: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*COMMANDS["list"], f"--page-size={value}"])
    assert exit_.value.code == 2 and seen == {}
    assert f"from 1 to {MAX_PAGE_SIZE}" in capsys.readouterr().err


@pytest.mark.parametrize("value", [1, MAX_PAGE_SIZE])
def test_page_sizes_at_the_limits_are_taken(value: int, seen: dict[str, Any]) -> None:
    assert cli.main([*COMMANDS["list"], "--page-size", str(value)]) == 0
    assert seen["page_size"] == value


def test_no_page_size_leaves_it_to_the_server(seen: dict[str, Any]) -> None:
    assert cli.main(COMMANDS["list"]) == 0 and seen["page_size"] == 0
