"""Answer-quality harness: the whole mesh answers the gold questions over real documents.

Starts the real mesh (services/devtools/mesh.py: four servers and Envoy on free ports, a fresh
temp data dir), ingests the gold documents into one tenant through retrieval's JSON ingest
route (the one `visior ingest` uses), asks every question through
`POST /internal/orchestrator/respond` (S3/S4 with the selected doc_ids) and scores each answer
(bench/answers/scoring.py). See bench/README.md, "Answer quality".
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from bench.answers.documents import CACHE, DocumentError, prepare  # noqa: E402
from bench.answers.gold import GOLD, Question, document_pages, load, validate  # noqa: E402
from bench.answers.scoring import (  # noqa: E402
    detect_language,
    facts_found,
    page_in_sources,
    says_not_in_documents,
)
from bench.tool_limits import NO_TOOL_RATE_LIMITS  # noqa: E402
from services.cli.main import http_error  # noqa: E402
from services.common.topology import Ports  # noqa: E402
from services.devtools.local_model import LocalModelConfig  # noqa: E402
from services.devtools.mesh import (  # noqa: E402
    Mesh,
    MeshError,
    local_envoy_timeouts,
    local_model_env,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"  # *.full.json ignored by git (bench/answers/.gitignore)
TENANT = "answers"
USER = "answers-bench"
KB_DIR = REPO / "samples" / "knowledge_base"
KB_TENANT = "__knowledge_base__"
RESPONDERS = ("extractive", "local")


@dataclass
class Outcome:
    """One question's answer and its scores."""

    id: str
    lang: str
    scenario: str
    kind: str
    split: str
    question: str
    cross_language: bool = False
    """The answering passage is in the other language than the question."""
    status: int = 0
    error: str = ""
    """Empty when the answer came back 200; else the kind: HTTP <status> <reason>, timeout, ..."""
    error_detail: str = ""
    seconds: float = 0.0
    answer: str = ""
    sources: list[dict[str, Any]] = field(default_factory=list)
    telemetry: dict[str, Any] = field(default_factory=dict)
    tools: list[str] = field(default_factory=list)
    tool_errors: list[str] = field(default_factory=list)
    """The `result_summary` of each tool call that failed ("tool_error CODE: message")."""
    page_hit: bool | None = None
    """Answerable only: the gold page (or an alternative) within a source's range."""
    page_hit_first: bool | None = None
    """Answerable only: ... within the first source's range."""
    facts_total: int = 0
    facts_found: int = 0
    not_in_documents: bool = False
    answer_lang: str = ""


def ingest(client: httpx.Client, url: str, tenant: str, paths: dict[str, Path]) -> dict[str, str]:
    """Each file into `tenant`; file name -> doc_id."""
    ids: dict[str, str] = {}
    for name, path in paths.items():
        payload = {
            "tenant_id": tenant,
            "file_name": name,
            "content": base64.b64encode(path.read_bytes()).decode(),
        }
        r = client.post(f"{url}/internal/retrieval/documents", json=payload)
        if r.status_code != 200:
            kind, detail = http_error(r, 300)
            raise RuntimeError(f"ingesting {name} failed: {kind}: {detail}")
        body = r.json()
        ids[name] = body.get("doc_id") or (body.get("doc_ids") or [""])[0]
        print(
            f"  {name} -> {ids[name]}: {body.get('sections', 0)} sections, "
            f"{body.get('chunks', 0)} chunks, {body.get('pages', 0)} pages",
            flush=True,
        )
    return ids


def ask(
    client: httpx.Client, url: str, q: Question, doc_ids: dict[str, str], timeout: float
) -> Outcome:
    out = Outcome(q.id, q.lang, q.scenario, q.kind, q.split, q.question, q.cross_language)
    payload: dict[str, Any] = {"query": q.question, "user": {"user_id": USER, "tenant_id": TENANT}}
    if q.select:
        payload["doc_ids"] = [doc_ids[name] for name in q.select]
    start = time.perf_counter()
    try:
        r = client.post(f"{url}/internal/orchestrator/respond", json=payload, timeout=timeout)
    except httpx.TimeoutException as exc:
        out.error, out.error_detail = "timeout", repr(exc)
    except httpx.HTTPError as exc:
        out.error, out.error_detail = type(exc).__name__, str(exc)[:300]
    else:
        out.status = r.status_code
        if r.status_code != 200:
            out.error, out.error_detail = http_error(r, 300)
        else:
            body = r.json()
            out.answer = body.get("answer", "")
            out.sources = body.get("sources", [])
            out.telemetry = body.get("telemetry", {})
            out.tools = [t.get("name", "") for t in body.get("tools", [])]
            out.tool_errors = [
                f"{t.get('name', '')}: {t.get('result_summary', '')}"
                for t in body.get("tools", [])
                if str(t.get("result_summary", "")).startswith("tool_error")
            ]
    out.seconds = time.perf_counter() - start
    score(out, q, doc_ids)
    return out


def score(out: Outcome, q: Question, doc_ids: dict[str, str]) -> None:
    """Fill in the scores of an answer (an error scores as a miss everywhere)."""
    out.facts_total = len(q.facts)
    if out.error:
        out.page_hit = out.page_hit_first = False if q.answerable else None
        return
    if q.answerable:
        locations = [(doc_ids.get(d, d), p) for d, p in q.locations()]
        out.page_hit = page_in_sources(out.sources, locations)
        out.page_hit_first = page_in_sources(out.sources[:1], locations)
        out.facts_found = facts_found(q.facts, out.answer)
    out.not_in_documents = says_not_in_documents(out.answer)
    out.answer_lang = detect_language(out.answer)


def _pct(num: int, den: int) -> str:
    return f"{num}/{den} = {100 * num / den:.0f} %" if den else "-"


def _quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, round(q * len(s) + 0.5) - 1))] if s else 0.0


def _model_figures(ok: Sequence[Outcome]) -> dict[str, Any]:
    """From the telemetry of answers that called a model: prompt tokens the runtime processed
    (prompt - cached) over the final prompt's tokens, and the share of the Respond time spent
    outside the runtime (mesh overhead)."""
    used = [o for o in ok if int(o.telemetry.get("model_calls") or 0) > 0]
    ratios = [
        (
            int(o.telemetry.get("prompt_tokens") or 0)
            - int(o.telemetry.get("prompt_tokens_cached") or 0)
        )
        / int(o.telemetry["final_prompt_tokens"])
        for o in used
        if int(o.telemetry.get("final_prompt_tokens") or 0) > 0
    ]
    overhead = [
        max(0.0, 1 - int(o.telemetry.get("llm_runtime_ms") or 0) / (1000 * o.seconds))
        for o in used
        if o.seconds > 0
    ]
    return {
        "model_calls_mean": (
            round(statistics.fmean(int(o.telemetry["model_calls"]) for o in used), 2) if used else 0
        ),
        "processed_over_final_prompt_mean": round(statistics.fmean(ratios), 2) if ratios else None,
        "processed_over_final_prompt_max": round(max(ratios), 2) if ratios else None,
        "outside_runtime_share_mean": round(statistics.fmean(overhead), 3) if overhead else None,
    }


def summarize(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The figures of one responder on one set of questions."""
    answerable = [o for o in outcomes if o.kind != "unanswerable"]
    unanswerable = [o for o in outcomes if o.kind == "unanswerable"]
    ok = [o for o in outcomes if not o.error]
    secs = [o.seconds for o in ok]
    scen = [o for o in ok if o.telemetry.get("scenario")]
    return {
        "questions": len(outcomes),
        "answerable": len(answerable),
        "unanswerable": len(unanswerable),
        "errors": len(outcomes) - len(ok),
        "errors_by_kind": dict(Counter(o.error for o in outcomes if o.error)),
        "with_tool_error": sum(1 for o in ok if o.tool_errors),
        "page_among_sources": sum(1 for o in answerable if o.page_hit),
        "page_in_first_source": sum(1 for o in answerable if o.page_hit_first),
        "source_pages_mean": (
            round(
                statistics.fmean(
                    max(int(s.get("page_end") or 0), int(s.get("page_start") or 0))
                    - int(s.get("page_start") or 0)
                    + 1
                    for o in ok
                    for s in o.sources
                ),
                2,
            )
            if any(o.sources for o in ok)
            else 0
        ),
        "all_key_facts": sum(
            1 for o in answerable if o.facts_total and o.facts_found == o.facts_total
        ),
        "key_facts_found": sum(o.facts_found for o in answerable),
        "key_facts_total": sum(o.facts_total for o in answerable),
        "unanswerable_said_not_in_documents": sum(1 for o in unanswerable if o.not_in_documents),
        "answerable_said_not_in_documents": sum(1 for o in answerable if o.not_in_documents),
        "language_as_asked": sum(1 for o in ok if o.answer_lang == o.lang),
        "answered": len(ok),
        "scenario_as_gold": sum(1 for o in scen if o.telemetry.get("scenario") == o.scenario),
        "with_scenario": len(scen),
        "scenarios": dict(Counter(f"{o.scenario}->{o.telemetry.get('scenario', '?')}" for o in ok)),
        "intents": dict(Counter(str(o.telemetry.get("intent", "")) for o in ok)),
        "tool_calls_mean": round(statistics.fmean(len(o.tools) for o in ok), 2) if ok else 0,
        "tool_steps_mean": (
            round(statistics.fmean(int(o.telemetry.get("tool_steps") or 0) for o in ok), 2)
            if ok
            else 0
        ),
        **_model_figures(ok),
        "seconds_mean": round(statistics.fmean(secs), 3) if secs else 0,
        "seconds_p50": round(_quantile(secs, 0.5), 3),
        "seconds_p95": round(_quantile(secs, 0.95), 3),
        "page_missed_ids": [o.id for o in answerable if not o.page_hit],
        "facts_missed_ids": [o.id for o in answerable if o.facts_found < o.facts_total],
        "unanswerable_answered_ids": [o.id for o in unanswerable if not o.not_in_documents],
        "false_not_in_documents_ids": [o.id for o in answerable if o.not_in_documents],
        "wrong_language_ids": [o.id for o in ok if o.answer_lang != o.lang],
        "error_ids": [o.id for o in outcomes if o.error],
        "tool_error_ids": [o.id for o in ok if o.tool_errors],
    }


def print_summary(responder: str, split: str, s: dict[str, Any]) -> None:
    a = s["answerable"]
    print(f"\n== {responder} / {split}: {s['questions']} questions "
          f"({a} answerable, {s['unanswerable']} not answered by the documents)")  # fmt: skip
    kinds = ", ".join(f"{k}: {n}" for k, n in s["errors_by_kind"].items())
    print(f"errors                               {s['errors']}" + (f" ({kinds})" if kinds else ""))
    print(f"answers with a failed tool call      {s['with_tool_error']}")
    print(f"answer's page among sources          {_pct(s['page_among_sources'], a)}")
    print(f"  ... in the first source            {_pct(s['page_in_first_source'], a)}"
          f"  (pages per source: mean {s['source_pages_mean']})")  # fmt: skip
    print(f"all key facts present                {_pct(s['all_key_facts'], a)}")
    print(
        f"key facts present (share of facts)   {_pct(s['key_facts_found'], s['key_facts_total'])}"
    )
    print(f"unanswerable -> 'not in documents'   "
          f"{_pct(s['unanswerable_said_not_in_documents'], s['unanswerable'])}")  # fmt: skip
    print(f"answerable -> 'not in documents'     {_pct(s['answerable_said_not_in_documents'], a)}")
    print(f"answer language as asked             {_pct(s['language_as_asked'], s['answered'])}")
    print(f"seconds per answer                   mean {s['seconds_mean']:.2f}  "
          f"p50 {s['seconds_p50']:.2f}  p95 {s['seconds_p95']:.2f}")  # fmt: skip
    if s["with_scenario"]:
        print(f"scenario as gold (telemetry)         {_pct(s['scenario_as_gold'], s['with_scenario'])}"
              f"  {s['scenarios']}")  # fmt: skip
        print(f"intents                              {s['intents']}")
    print(f"tool calls per answer                mean {s['tool_calls_mean']}  "
          f"(telemetry tool_steps mean {s['tool_steps_mean']})")  # fmt: skip
    if s["processed_over_final_prompt_mean"] is not None:
        print(f"model calls per answer               mean {s['model_calls_mean']}; prompt tokens "
              f"processed / final prompt: mean {s['processed_over_final_prompt_mean']}, "
              f"max {s['processed_over_final_prompt_max']}; time outside the runtime: "
              f"{100 * (s['outside_runtime_share_mean'] or 0):.1f} % of a Respond")  # fmt: skip
    for key, label in (
        ("error_ids", "errors"),
        ("tool_error_ids", "a tool call failed"),
        ("page_missed_ids", "gold page not among sources"),
        ("facts_missed_ids", "key facts missing"),
        ("unanswerable_answered_ids", "unanswerable, answered anyway"),
        ("false_not_in_documents_ids", "answerable, said 'not in documents'"),
        ("wrong_language_ids", "answer language not as asked"),
    ):
        if s[key]:
            print(f"  {label}: {' '.join(s[key])}")


def _git_commit() -> str:
    """HEAD's short hash, with "+dirty" when services/ has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "services"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return ""
    return head + ("+dirty" if dirty else "")


def run_responder(
    responder: str, questions: Sequence[Question], paths: dict[str, Path], a: argparse.Namespace
) -> list[Outcome]:
    # The harness asks the same documents far more often than a user would (bench/tool_limits.py).
    env: dict[str, str] = {**NO_TOOL_RATE_LIMITS, **dict(kv.split("=", 1) for kv in a.server_env)}
    local: LocalModelConfig | None = None
    timeouts = None
    if responder == "local":
        if a.runtime_url:
            env.update(
                local_model_env(a.runtime_url, a.model_name, a.model_ctx, {**os.environ, **env})
            )
            timeouts = local_envoy_timeouts()
        else:
            local = LocalModelConfig(data_dir=a.model_data_dir, n_ctx=a.model_ctx)
    with tempfile.TemporaryDirectory(prefix="visior-answers-") as tmp:
        mesh = Mesh(
            Ports.free(),
            Path(tmp) / "data",
            Path(a.keep_logs or Path(tmp) / "run"),
            env=env,
            envoy_timeouts=timeouts,
            local_model=local,
        )
        print(f"\n[{responder}] starting the mesh …", flush=True)
        t0 = time.perf_counter()
        mesh.start()
        try:
            print(f"[{responder}] up in {time.perf_counter() - t0:.1f} s; ingesting", flush=True)
            with httpx.Client(timeout=600) as client:
                retr = mesh.json_url("retrieval")
                doc_ids = ingest(client, retr, TENANT, paths)
                if a.kb and KB_DIR.is_dir():
                    kb = {p.name: p for p in sorted(KB_DIR.glob("*.csv"))}
                    if kb:
                        ingest(client, retr, KB_TENANT, kb)
                orch = mesh.json_url("orchestrator")
                outcomes: list[Outcome] = []
                for i, q in enumerate(questions, 1):
                    o = ask(client, orch, q, doc_ids, a.timeout)
                    outcomes.append(o)
                    mark = o.error or (
                        ("page " if o.page_hit else "PAGE-MISS ")
                        + f"facts {o.facts_found}/{o.facts_total}"
                        if q.answerable
                        else ("not-in-docs" if o.not_in_documents else "ANSWERED")
                    )
                    print(f"  [{i}/{len(questions)}] {q.id} {o.seconds:6.2f}s {mark}", flush=True)
        finally:
            mesh.stop()
    return outcomes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", choices=("dev", "heldout", "all"), default="dev")
    p.add_argument("--limit", type=int, default=0, help="first N questions of the split")
    p.add_argument("--ids", default="", help="only these question ids (comma-separated)")
    p.add_argument(
        "--responder",
        default="extractive",
        help="extractive, local, or both comma-separated (local: the local model, or "
        "--runtime-url)",
    )
    p.add_argument("--runtime-url", default="", help="an OpenAI-compatible server for 'local'")
    p.add_argument("--model-name", default="local", help="model name sent to --runtime-url")
    p.add_argument("--model-ctx", type=int, default=8192, help="the local model's n_ctx")
    p.add_argument("--model-data-dir", type=Path, default=REPO / "data")
    p.add_argument("--timeout", type=float, default=0, help="seconds per question "
                   "(default 120; 960 for local)")  # fmt: skip
    p.add_argument("--no-kb", dest="kb", action="store_false",
                   help="do not ingest samples/knowledge_base into the shared knowledge base")  # fmt: skip
    p.add_argument("--server-env", action="append", default=[], metavar="K=V")
    p.add_argument("--cache", type=Path, default=CACHE, help="downloaded documents")
    p.add_argument("--keep-logs", default="", help="the mesh's logs go here (kept)")
    p.add_argument("--out", type=Path, default=None,
                   help="full per-question JSON (default bench/answers/results/<...>.full.json, "
                   "ignored by git)")  # fmt: skip
    p.add_argument("--summary", type=Path, default=None,
                   help="summary JSON (default bench/answers/results/latest-<responder>-<split>.json)")  # fmt: skip
    p.add_argument(
        "--check", action="store_true", help="fetch and check the documents and gold pages only"
    )
    p.add_argument(
        "--resummarize", type=Path, default=None, metavar="FULL_JSON",
        help="print the figures of a saved run (--out file) again; no mesh",
    )  # fmt: skip
    a = p.parse_args(argv)
    if a.resummarize:
        saved = json.loads(a.resummarize.read_text())
        outs = [Outcome(**o) for o in saved["outcomes"]]
        for split in ("dev", "heldout"):
            part = [o for o in outs if o.split == split]
            if part:
                print_summary(saved.get("responder", "?"), split, summarize(part))
        return 0
    responders = [r.strip() for r in a.responder.split(",") if r.strip()]
    if bad := [r for r in responders if r not in RESPONDERS]:
        p.error(f"unknown responder {bad}; choose from {RESPONDERS}")
    try:
        paths = prepare(a.cache)
    except DocumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    questions = load(GOLD)
    problems = validate(questions, document_pages(paths))
    if problems:
        print("error: the gold set does not match its documents:\n  " + "\n  ".join(problems),
              file=sys.stderr)  # fmt: skip
        return 1
    print(
        f"documents and gold pages check out ({len(questions)} questions, {len(paths)} documents)"
    )
    if a.check:
        return 0
    if a.split != "all":
        questions = [q for q in questions if q.split == a.split]
    if a.ids:
        wanted = set(a.ids.split(","))
        questions = [q for q in questions if q.id in wanted]
    if a.limit:
        questions = questions[: a.limit]
    if a.split in ("heldout", "all"):
        print("held-out questions: report the figures, do not tune on their per-question results")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d-%H%M%S")
    commit = _git_commit()  # the code the mesh starts with, before the run
    rc = 0
    for responder in responders:
        a.timeout = a.timeout or (960.0 if responder == "local" else 120.0)
        try:
            outcomes = run_responder(responder, questions, paths, a)
        except (MeshError, RuntimeError) as exc:
            print(f"error: {responder}: {exc}", file=sys.stderr)
            rc = 1
            continue
        splits = ["dev", "heldout"] if a.split == "all" else [a.split]
        summaries = {}
        for split in splits:
            part = [o for o in outcomes if o.split == split]
            if part:
                summaries[split] = summarize(part)
                print_summary(responder, split, summaries[split])
        cross = [o for o in outcomes if o.cross_language]
        if cross:
            s = summarize(cross)
            print(f"  cross-language (answering passage in the other language): {len(cross)} q, "
                  f"page {_pct(s['page_among_sources'], s['answerable'])}, "
                  f"first source {_pct(s['page_in_first_source'], s['answerable'])}, "
                  f"all facts {_pct(s['all_key_facts'], s['answerable'])}; "
                  f"page missed: {' '.join(s['page_missed_ids']) or '-'}")  # fmt: skip
            summaries["cross_language"] = s
        for lang in ("ru", "en"):
            for sc in ("S1", "S3", "S4"):
                part = [o for o in outcomes if o.lang == lang and o.scenario == sc]
                if part:
                    s = summarize(part)
                    print(f"  {lang} {sc}: {len(part):2d} q, page {_pct(s['page_among_sources'], s['answerable'])}, "
                          f"all facts {_pct(s['all_key_facts'], s['answerable'])}, "
                          f"errors {s['errors']}")  # fmt: skip
        meta = {
            "responder": responder,
            "split": a.split,
            "questions": len(questions),
            "commit": commit,
            "when": stamp,
            "command": " ".join(
                ["bench/answers/run.py", *(argv if argv is not None else sys.argv[1:])]
            ),
            "runtime_url": a.runtime_url or None,
        }
        RESULTS.mkdir(exist_ok=True)
        out = a.out or RESULTS / f"{responder}-{a.split}-{stamp}.full.json"
        out.write_text(
            json.dumps(
                {**meta, "summary": summaries, "outcomes": [asdict(o) for o in outcomes]},
                ensure_ascii=False,
                indent=1,
            )
        )
        summary = a.summary or RESULTS / f"latest-{responder}-{a.split}.json"
        summary.write_text(
            json.dumps({**meta, "summary": summaries}, ensure_ascii=False, indent=1) + "\n"
        )
        print(f"\nper question: {out}\nsummary: {summary}")
        if any(s["errors"] for s in summaries.values()):
            rc = rc or 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
