"""The visior CLI and the local launcher take their defaults from the rules' owners: Envoy's
route timeouts, the parser's suffix table, the listing's page limit, the local model's config
and the LLM service's MAX_COMPLETION_TOKENS."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import services.cli.main as cli
import services.devtools.local_model_server as lms
from services.common.search_contract import KB_TENANT
from services.devtools.envoy_config import DEFAULT_TIMEOUT_S, ROUTE_RULES, route_timeout
from services.devtools.local_model import LocalModelConfig
from services.devtools.mesh import (
    Mesh,
    local_envoy_timeouts,
)
from services.docstore.parsing import SUFFIX_FORMATS, guess_format

RESPOND = "/internal/orchestrator/respond"
DOCUMENTS = "/internal/retrieval/documents"


def _rule(path: str, method: str | None = None) -> float:
    return next(r.timeout_s for r in ROUTE_RULES if r.path == path and r.method == method)


# --- route timeouts --------------------------------------------------------------------------


def test_route_timeout_reads_the_rules_the_prefix_route_and_overrides() -> None:
    assert route_timeout(RESPOND) == _rule(RESPOND)
    assert route_timeout(DOCUMENTS, "POST") == _rule(DOCUMENTS, "POST")
    assert route_timeout(DOCUMENTS, "GET") == DEFAULT_TIMEOUT_S  # the POST rule is not GET's
    assert route_timeout("/internal/retrieval/search", "post") == DEFAULT_TIMEOUT_S
    assert route_timeout(RESPOND, "POST", {RESPOND: 930.0}) == 930.0
    assert route_timeout(DOCUMENTS, "GET", {"default": 7.0}) == 7.0


def _main_passes(monkeypatch: pytest.MonkeyPatch, name: str, argv: list[str]) -> float:
    """The timeout `visior <argv>` hands to `cli.<name>`."""
    seen: list[Any] = []

    def record(*args: Any, **options: Any) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(cli, name, record)
    assert cli.main(argv) == 0
    return seen[0][2] if name == "list_documents" else seen[0][-1]


def test_each_command_waits_past_its_route_so_envoys_answer_comes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ask = _main_passes(monkeypatch, "ask", ["ask", "q"])
    local_respond = route_timeout(RESPOND, "POST", local_envoy_timeouts())
    # A running mesh may run the local model: ask waits past the longer respond route.
    assert ask == local_respond + cli.ENVOY_FIRST_MARGIN_S
    assert ask > local_respond >= route_timeout(RESPOND)
    ingest = _main_passes(monkeypatch, "ingest", ["ingest", "x", "--tenant", "t"])
    assert ingest == route_timeout(DOCUMENTS, "POST") + cli.ENVOY_FIRST_MARGIN_S
    listed = _main_passes(monkeypatch, "list_documents", ["list", "--tenant", "t"])
    assert listed == route_timeout(DOCUMENTS, "GET") + cli.ENVOY_FIRST_MARGIN_S
    assert 0 < cli.ENVOY_FIRST_MARGIN_S <= 10


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_ask_help_states_the_default_and_its_rule(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(["ask"], capsys)
    assert f"default {cli.ASK_TIMEOUT_S:g}" in text
    assert "local model" in text and "504" in text


@pytest.mark.parametrize("model", ["extractive", "local"])
def test_demo_waits_past_the_routes_of_the_mesh_it_started(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLM_RUNTIME_URL", raising=False)
    monkeypatch.setattr(Mesh, "start", lambda self: self)
    monkeypatch.setattr(Mesh, "stop", lambda self: None)
    monkeypatch.setattr(cli, "_print_where", lambda mesh: None)
    waits: dict[str, list[float]] = {"ingest_samples": [], "ask": []}

    def recorder(name: str) -> Any:
        def record(*args: Any) -> int:
            waits[name].append(args[-1])
            return 0

        return record

    for name in waits:
        monkeypatch.setattr(cli, name, recorder(name))
    assert cli.demo("q", model=model, model_data_dir=tmp_path) == 0
    routes = local_envoy_timeouts() if model == "local" else None
    respond = route_timeout(RESPOND, "POST", routes)
    assert waits["ask"] == [respond + cli.ENVOY_FIRST_MARGIN_S] * 2
    ingest = route_timeout(DOCUMENTS, "POST", routes) + cli.ENVOY_FIRST_MARGIN_S
    assert waits["ingest_samples"] == [ingest]


# --- ingestible files ------------------------------------------------------------------------


def test_the_suffix_table_is_what_guess_format_reads() -> None:
    for suffix, fmt in SUFFIX_FORMATS.items():
        assert guess_format(f"dir/Name{suffix.upper()}", "") == fmt
    assert guess_format("a.text", "") == "text"
    assert guess_format("a.md", "text/plain") == "markdown"  # the suffix decides
    assert guess_format("a.txt", "application/pdf") == "text"
    assert guess_format("md", "") == "unknown" and guess_format("a.v2/readme", "") == "unknown"


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    for name in ("a.md", "b.TEXT", "sub/c.txt", "kb.csv", "notes.log", "LICENSE"):
        (folder / name).write_text("# x\n\ntext\n", encoding="utf-8")
    return folder


def _ingest(monkeypatch: pytest.MonkeyPatch, folder: Path, tenant: str) -> tuple[int, list[str]]:
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert base64.b64decode(body["content"]) and body["tenant_id"] == tenant
        sent.append(body["file_name"])
        return httpx.Response(200, json={"doc_id": body["file_name"]})

    real = httpx.Client
    monkeypatch.setattr(
        cli.httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    return cli.ingest("http://sidecar", [str(folder)], tenant, 5.0), sent


def test_a_folder_gives_every_parsed_format_and_a_tenant_no_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, sent = _ingest(monkeypatch, _folder(tmp_path), "acme")
    assert rc == 0 and sent == ["a.md", "b.TEXT", "c.txt"]
    out = capsys.readouterr().out
    assert "kb.csv: skipped" in out and "--knowledge-base" in out
    assert "3 of 3 ingested" in out


def test_the_knowledge_base_gets_the_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rc, sent = _ingest(monkeypatch, _folder(tmp_path), KB_TENANT)
    assert rc == 0 and "kb.csv" in sent


def test_page_size_help_comes_from_the_listing_limit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "MAX_PAGE_SIZE", 77)
    assert "(1-77;" in _help(["list"], capsys)


# --- the local model server and the mesh -------------------------------------------------


def test_the_model_servers_defaults_are_the_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    class Started(Exception):
        pass

    def server(args: Any) -> None:
        raise Started(args)

    monkeypatch.setitem(sys.modules, "xllamacpp", SimpleNamespace(Server=server))
    monkeypatch.setattr(lms, "params", lambda args: args)
    monkeypatch.setattr(lms.signal, "signal", lambda *a: None)
    monkeypatch.setattr(LocalModelConfig, "n_ctx", 1234)
    monkeypatch.setattr(LocalModelConfig, "threads", 3)
    with pytest.raises(Started) as started:
        lms.main(["--model", "m.gguf", "--port", "1", "--alias", "a"])
    args = started.value.args[0]
    assert (args.n_ctx, args.threads) == (1234, 3)


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (400, {"code": 3, "message": "bad", "details": [{"reason": "INVALID_ARGUMENT"}]},
         ("HTTP 400 INVALID_ARGUMENT", "bad")),
        (413, {"code": 8, "message": "too big", "details": []}, ("HTTP 413", "too big")),
    ],
)  # fmt: skip
def test_an_error_answer_reads_as_its_status_reason_and_message(status, body, said) -> None:
    # The CLI and the answer harness read Envoy's error body with this one function.
    assert cli.http_error(httpx.Response(status, json=body)) == said
    assert cli.http_error(httpx.Response(502, text="x" * 900), 300) == ("HTTP 502", "x" * 300)
    assert cli._error_text(httpx.Response(status, json=body)) == f"{said[0]}: {said[1]}"


@pytest.mark.parametrize("value", [None, "/srv/visior-data"])
def test_the_data_directory_defaults_to_the_services_setting(monkeypatch, value) -> None:
    # Unset, it is the repository's data/, where the services keep it by default.
    from services.common.shared_config import DATA_DIR
    from services.devtools.envoy import REPO_ROOT

    if value is None:
        monkeypatch.delenv("VISIOR_DATA_DIR", raising=False)
    else:
        monkeypatch.setenv("VISIOR_DATA_DIR", value)
    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli, "run", lambda data_dir, *a, **k: seen.setdefault("run", data_dir))
    monkeypatch.setattr(cli, "demo", lambda *a, **k: seen.setdefault("demo", k["model_data_dir"]))
    cli.main(["run"])
    cli.main(["demo"])
    expected = Path(value) if value else REPO_ROOT / DATA_DIR.default
    assert seen == {"run": expected, "demo": expected}


def test_the_mesh_gives_the_services_its_data_directory_as_an_absolute_path(tmp_path) -> None:
    # The services run in the repository root; a relative path would name another directory.
    from services.common.topology import Ports
    from services.devtools.mesh import Mesh

    mesh = Mesh(Ports(), "rel-data", tmp_path)
    assert mesh.env()["VISIOR_DATA_DIR"] == str(Path("rel-data").resolve())
