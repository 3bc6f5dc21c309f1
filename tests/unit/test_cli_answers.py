"""What the visior CLI makes of the answers it gets: a body of an unexpected shape (an error
body that is no JSON object, string `details`, a 200 that is no JSON object or lacks a
field) is one `error:` line and exit code 1, never a traceback; and text from the mesh (an
answer, a document's title or id, an error message) reaches the terminal with its control
characters escaped, so an ingested document cannot send it escape sequences."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import services.cli.main as cli

Handler = Callable[[httpx.Request], httpx.Response]

ESCAPES = "\x1b[2J\x1b]0;owned\x07\r\x9b31m\x7f\x00"
"""Clear the screen, set the window title, return to the line start, a C1 CSI, DEL, NUL."""
ESCAPED = "\\x1b[2J\\x1b]0;owned\\x07\\x0d\\x9b31m\\x7f\\x00"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\x7f", "\x00")


@pytest.fixture
def answering(monkeypatch: pytest.MonkeyPatch) -> Callable[[Handler], None]:
    """Route the CLI's HTTP calls (httpx.request and httpx.Client) to a handler."""

    def install(handler: Handler) -> None:
        transport = httpx.MockTransport(handler)
        real = httpx.Client

        def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
            with real(transport=transport) as client:
                return client.request(method, url, **kwargs)

        monkeypatch.setattr(cli.httpx, "request", request)
        monkeypatch.setattr(cli.httpx, "Client", lambda **kw: real(transport=transport, **kw))

    return install


def _always(response: httpx.Response) -> Handler:
    return lambda request: response


def _doc(tmp_path: Path) -> str:
    path = tmp_path / "a.md"
    path.write_text("# a\n\ntext\n", encoding="utf-8")
    return str(path)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# --- bodies of an unexpected shape --------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "said"),
    [
        (httpx.Response(502, json=["x"]), ("HTTP 502", '["x"]')),
        (httpx.Response(502, json="upstream down"), ("HTTP 502", '"upstream down"')),
        (httpx.Response(502, content=b"null"), ("HTTP 502", "null")),
        (httpx.Response(400, json={"message": "m", "details": ["reason"]}), ("HTTP 400", "m")),
        (httpx.Response(400, json={"message": "m", "details": {"reason": "R"}}), ("HTTP 400", "m")),
        (
            httpx.Response(400, json={"message": "m", "details": ["reason", {"reason": "R"}]}),
            ("HTTP 400 R", "m"),
        ),
    ],
)
def test_an_error_body_of_any_shape_reads_as_status_and_message(response, said) -> None:
    assert cli.http_error(response) == said


BAD_ANSWERS = {
    "not JSON": httpx.Response(200, text="<html>proxy</html>"),
    "a JSON list": httpx.Response(200, json=["answer"]),
    "a JSON string": httpx.Response(200, json="answer"),
    "an error list": httpx.Response(502, json=["x"]),
    "string details": httpx.Response(400, json={"message": "bad", "details": ["reason"]}),
}


@pytest.mark.parametrize("name", BAD_ANSWERS)
@pytest.mark.parametrize(
    "argv", [["ask", "q", "--url", "http://o"], ["list", "--tenant", "t", "--url", "http://r"]]
)
def test_an_answer_of_an_unexpected_shape_is_one_error_line(
    name: str, argv: list[str], answering, capsys: pytest.CaptureFixture[str]
) -> None:
    answering(_always(BAD_ANSWERS[name]))
    rc, out, err = _run(argv, capsys)
    assert rc == 1 and out == ""
    assert err.startswith("error: HTTP ") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "body"),
    [
        (["ask", "q", "--url", "http://o"], {"sources": []}),
        (["ask", "q", "--url", "http://o"], {"answer": "a", "sources": [{"doc_id": "d"}]}),
        (["ask", "q", "--url", "http://o"], {"answer": "a", "sources": "d"}),
        (["list", "--tenant", "t", "--url", "http://r"], {"documents": [{"doc_id": "d"}]}),
        (["list", "--tenant", "t", "--url", "http://r"], {"documents": "d"}),
        (["list", "--tenant", "t", "--url", "http://r"], {"documents": [], "next_page_token": 1}),
    ],
)
def test_an_answer_missing_a_field_is_one_error_line(
    argv: list[str], body: dict[str, Any], answering, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = iter([body])  # then the last page, so that a CLI following the token ends
    answering(lambda request: httpx.Response(200, json=next(answers, {"documents": []})))
    rc, out, err = _run(argv, capsys)
    assert rc == 1 and out == ""
    assert err.startswith("error: ") and "is not a" in err and err.count("\n") == 1


@pytest.mark.parametrize("name", BAD_ANSWERS)
def test_an_ingest_answer_of_an_unexpected_shape_fails_that_document(
    name: str, answering, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answering(_always(BAD_ANSWERS[name]))
    rc, out, _ = _run(["ingest", _doc(tmp_path), "--tenant", "t", "--url", "http://r"], capsys)
    assert rc == 1
    assert "a.md failed: HTTP " in out and "0 of 1 ingested" in out


def test_an_ingest_answer_missing_a_field_fails_that_document(
    answering, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answering(_always(httpx.Response(200, json={"doc_ids": {"a": 1}})))
    rc, out, _ = _run(["ingest", _doc(tmp_path), "--tenant", "t", "--url", "http://r"], capsys)
    assert rc == 1
    assert "a.md failed: retrieval's answer is not an ingest answer" in out


# --- text from the mesh on the terminal ---------------------------------------------------------


def _raw_free(text: str) -> bool:
    """No raw control character in `text` but the CLI's own: newlines, tabs, and the
    carriage return before each ingested file's line."""
    return not any(c in text.replace("\r[1/1]", "[1/1]") for c in RAW)


def test_an_answer_keeps_its_lines_and_loses_its_escape_sequences(
    answering, capsys: pytest.CaptureFixture[str]
) -> None:
    source = {
        "doc_id": f"d{ESCAPES}", "section_id": f"s{ESCAPES}", "page_start": 1, "page_end": 2,
        "score": 0.5,
    }  # fmt: skip
    body = {
        "answer": f"line one\n\tline two{ESCAPES}",
        "sources": [source],
        "telemetry": {"trace_id": f"t{ESCAPES}"},
    }
    answering(_always(httpx.Response(200, json=body)))
    rc, out, _ = _run(["ask", "q", "--url", "http://o"], capsys)
    assert rc == 0 and _raw_free(out)
    assert out.startswith(f"line one\n\tline two{ESCAPED}\n")
    assert f"  - d{ESCAPED} / s{ESCAPED}, pages 1–2 (score 0.50)" in out
    assert f"trace_id=t{ESCAPED} " in out


def test_the_json_answer_escapes_every_control_character_and_reads_back(
    answering, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"answer": f"a\n{ESCAPES}é", "sources": []}
    answering(_always(httpx.Response(200, json=body)))
    rc, out, _ = _run(["ask", "q", "--url", "http://o", "--json"], capsys)
    assert rc == 0 and _raw_free(out) and "é" in out
    assert json.loads(out) == body


def test_a_listed_title_stays_on_its_line_and_in_its_column(
    answering, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {"doc_id": "d", "title": f"T\tfake\nline{ESCAPES}", "pages": 1, "chunks": 2}
    answering(_always(httpx.Response(200, json={"documents": [doc]})))
    rc, out, _ = _run(["list", "--tenant", "t", "--url", "http://r"], capsys)
    assert rc == 0 and _raw_free(out)
    assert out == f"d\tT\\x09fake\\x0aline{ESCAPED}\t1 pages\t2 chunks\n"


@pytest.mark.parametrize("argv", [["ask", "q", "--url", "http://o"], ["ingest"]])
def test_an_error_message_is_one_line_without_escape_sequences(
    argv: list[str], answering, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv == ["ingest"]:
        argv = ["ingest", _doc(tmp_path), "--tenant", "t", "--url", "http://r"]
    body = {"message": f"bad\nerror: forged line{ESCAPES}", "details": [{"reason": "R\x1b"}]}
    answering(_always(httpx.Response(400, json=body)))
    rc, out, err = _run(argv, capsys)
    said = out if argv[0] == "ingest" else err
    assert rc == 1 and _raw_free(said)
    assert "HTTP 400 R\\x1b: bad error: forged line\\x1b[2J" in said
    assert "\nerror: forged" not in said


def test_an_ingested_documents_id_is_printed_escaped(
    answering, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answering(_always(httpx.Response(200, json={"doc_id": f"d{ESCAPES}", "sections": 1})))
    rc, out, _ = _run(["ingest", _doc(tmp_path), "--tenant", "t", "--url", "http://r"], capsys)
    assert rc == 0
    assert _raw_free(out)
    assert f"a.md -> d{ESCAPED}: 1 sections" in out


def test_a_file_name_with_escape_sequences_is_printed_escaped(
    answering, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a\x1b]0;owned\x07.md"
    path.write_text("# a\n", encoding="utf-8")
    answering(_always(httpx.Response(200, json={"doc_id": "a"})))
    rc, out, _ = _run(["ingest", str(path), "--tenant", "t", "--url", "http://r"], capsys)
    assert rc == 0 and "\x1b" not in out and "\x07" not in out
    assert "a\\x1b]0;owned\\x07.md -> a" in out
