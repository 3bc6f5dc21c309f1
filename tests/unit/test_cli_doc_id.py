"""`visior ingest --doc-id` stores one file under the id given; a file whose name gives no
id (e.g. `!!!.md`) is not sent without it, and the CLI says to rename it or give --doc-id.
Also: `visior demo` and `make help` say the demo answers two questions, as it does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import services.cli.main as cli
from services.common import errors
from services.common.search_contract import KB_TENANT
from services.devtools.envoy import REPO_ROOT
from services.retrieval.ingestion import IngestInput, Ingestor


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The bodies `visior ingest` sends to a sidecar answering with the doc_id it was given
    (else the file name)."""
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        return httpx.Response(200, json={"doc_id": body.get("doc_id") or body["file_name"]})

    real = httpx.Client
    monkeypatch.setattr(
        cli.httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    return bodies


def _file(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text("# Notes\n\nHello.\n", encoding="utf-8")
    return str(path)


def test_a_doc_id_is_sent_with_the_one_file(
    tmp_path: Path, sent: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ingest", _file(tmp_path, "!!!.md"), "--tenant", "acme", "--doc-id", "notes"]
    assert cli.main(argv) == 0
    assert [(b["file_name"], b["doc_id"]) for b in sent] == [("!!!.md", "notes")]
    assert "notes: " in capsys.readouterr().out


def test_without_a_doc_id_none_is_sent(tmp_path: Path, sent: list[dict[str, Any]]) -> None:
    assert cli.main(["ingest", _file(tmp_path, "a.md"), "--tenant", "acme"]) == 0
    assert "doc_id" not in sent[0]


def test_a_name_giving_no_id_is_not_sent_and_the_cli_says_what_to_do(
    tmp_path: Path, sent: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    files = [_file(tmp_path, "!!!.md"), _file(tmp_path, "ok.md")]
    assert cli.main(["ingest", *files, "--tenant", "acme"]) == 1
    out = capsys.readouterr().out
    assert "!!!.md failed" in out and "rename the file" in out and "--doc-id" in out
    assert [b["file_name"] for b in sent] == ["ok.md"]


@pytest.mark.parametrize(
    "name", ["!!!.md", "---.txt", "!!!", "a.md", "中文.md", "x.csv", "!!!.pdf"]
)
def test_the_cli_refuses_for_its_name_what_the_service_does(name: str) -> None:
    service = SimpleNamespace(_max_bytes=1 << 20)
    try:
        Ingestor._validate(service, IngestInput("acme", b"x", file_name=name))  # type: ignore[arg-type]
    except errors.ServiceError as exc:
        refused = "no doc_id could be made" in str(exc)
    else:
        refused = False
    assert cli.no_doc_id(name) == refused


def test_a_doc_id_with_more_than_one_file_is_refused_before_anything_is_sent(
    tmp_path: Path, sent: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    files = [_file(tmp_path, "a.md"), _file(tmp_path, "b.md")]
    assert cli.main(["ingest", *files, "--tenant", "acme", "--doc-id", "x"]) == 2
    assert "--doc-id names one document" in capsys.readouterr().err
    assert sent == []


def test_a_doc_id_for_a_knowledge_base_csv_is_refused(
    tmp_path: Path, sent: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ingest", _file(tmp_path, "kb.csv"), "--knowledge-base", "--doc-id", "x"]
    assert cli.main(argv) == 2
    assert "from its rows" in capsys.readouterr().err
    assert sent == []
    assert cli.KB_TENANT == KB_TENANT


@pytest.mark.parametrize("value", ["", "!x", "-a", "a b", "x" * 129])
def test_a_doc_id_no_document_could_have_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["ingest", "a.md", "--tenant", "acme", f"--doc-id={value}"])
    assert caught.value.code == 2
    assert "doc_id must be" in capsys.readouterr().err


# --- the demo answers two questions ---


def test_demo_help_says_two_questions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "answer two questions" in out and "answer a question" not in out


def test_make_help_says_the_demo_answers_two_questions() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    (demo,) = re.findall(r"^demo:.*## (.*)$", makefile, re.MULTILINE)
    assert "two questions" in demo and "a question" not in demo
