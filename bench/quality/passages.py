"""Answer-page retrieval over mixed-language documents: is the page that answers a question among
Search's hits?

The answer harness (bench/answers/) asks whole questions through the mesh; this script asks
Retrieval alone, with the same questions and documents (bench/answers/gold.jsonl, read only;
the documents from bench/answers/documents.prepare(), pinned and hash-checked), so a change to
retrieval can be measured in a minute without a model. For each answerable question it runs
one Search (the server's defaults; `doc_ids` = the question's selection for S3/S4) and checks
whether a hit (top `--max-results`) covers the gold page or one of its alternatives.

Groups: `all`, the question's language, and **mixed**: the paragraph of the gold page that
holds the question's first key fact is in the other language than the question (a Russian
question answered by an untranslated English passage of a Russian man page, an English
question answered by Russian text). The paragraph's language is found by its Cyrillic share,
the same rule as services.retrieval.query.detect_language, not by hand.

The answer harness's held-out split is not for tuning here either: `--split heldout` prints a
reminder, and only `dev` was looked at per question.

    .venv/bin/python bench/quality/passages.py --target 127.0.0.1:50053            # dev
    .venv/bin/python bench/quality/passages.py --spawn --server-env RETR_EMBEDDING_PROFILE=fast
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for extra in (REPO, REPO / "gen" / "python"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import grpc  # noqa: E402
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc  # noqa: E402

from bench.answers import documents  # noqa: E402
from bench.answers.gold import Question, load  # noqa: E402
from bench.quality.metrics import doc_id_for  # noqa: E402
from bench.quality.run import MAX_MESSAGE, spawned_server  # noqa: E402
from services.retrieval.query import detect_language  # noqa: E402

TENANT = "passages-bench"


@dataclass
class Outcome:
    qid: str
    lang: str
    split: str
    passage_lang: str
    rank: int
    """1-based rank of the first hit covering a gold page; 0 when none does."""
    pages: list[tuple[str, int, int]]


def passage_language(q: Question, pages: dict[str, list[str]]) -> str:
    """Language of the gold page's paragraph holding the first key fact (the page's when none)."""
    if q.doc is None or q.page is None:
        return ""
    text = pages[q.doc][q.page - 1]
    facts = [f.rstrip("*").lower() for group in q.facts for f in group if f.rstrip("*")]
    paragraphs = [p for p in text.replace("\r", "").split("\n\n") if p.strip()] or [text]
    for fact in facts:
        for para in paragraphs:
            if fact in para.lower():
                return detect_language(para)
    return detect_language(text)


def groups_of(o: Outcome) -> list[str]:
    out = ["all", o.lang]
    if o.passage_lang in ("ru", "en") and o.passage_lang != o.lang:
        out.append("mixed")
    return out


def ingest(channel: grpc.Channel, paths: dict[str, Path], timeout: float) -> dict[str, str]:
    stub = retrieval_pb2_grpc.IngestionServiceStub(channel)
    ids: dict[str, str] = {}
    for name, path in paths.items():
        doc_id = doc_id_for(name)
        resp = stub.IngestDocument(
            retrieval_pb2.IngestDocumentRequest(
                tenant_id=TENANT, file_name=name, doc_id=doc_id, content=path.read_bytes()
            ),
            timeout=timeout,
        )
        ids[name] = doc_id
        print(f"  {name} -> {doc_id}: {resp.sections} sections, {resp.chunks} chunks", flush=True)
    return ids


def ask(
    stub: retrieval_pb2_grpc.RetrievalServiceStub,
    q: Question,
    ids: dict[str, str],
    max_results: int,
    timeout: float,
) -> tuple[int, list[tuple[str, int, int]]]:
    request = retrieval_pb2.SearchRequest(
        query=q.question, tenant_id=TENANT, max_results=max_results
    )
    request.filters.doc_ids.extend(ids[name] for name in q.select)
    response = stub.Search(request, timeout=timeout)
    wanted = [(ids[d], p) for d, p in q.locations()]
    hits = [(h.doc_id, h.page_start, h.page_end) for h in response.hits]
    for rank, (doc, start, end) in enumerate(hits, start=1):
        if any(doc == d and start <= p <= max(start, end) for d, p in wanted):
            return rank, hits
    return 0, hits


def summarise(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for split in sorted({o.split for o in outcomes}):
        for group in ("all", "ru", "en", "mixed"):
            part = [o for o in outcomes if o.split == split and group in groups_of(o)]
            if not part:
                continue
            n = len(part)
            rows.append(
                {
                    "split": split,
                    "group": group,
                    "n": n,
                    "hit@1": sum(o.rank == 1 for o in part) / n,
                    "hit@3": sum(1 <= o.rank <= 3 for o in part) / n,
                    "hit@10": sum(o.rank >= 1 for o in part) / n,
                    "mrr": sum(1 / o.rank for o in part if o.rank) / n,
                }
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="127.0.0.1:50053")
    ap.add_argument("--spawn", action="store_true", help="start python -m services.retrieval")
    ap.add_argument("--server-dir", type=Path, default=REPO)
    ap.add_argument("--server-env", action="append", default=[], metavar="K=V")
    ap.add_argument("--split", choices=("dev", "heldout", "all"), default="dev")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--max-results", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=None, help="per-question JSON record")
    args = ap.parse_args(argv)
    if args.split != "dev":
        print("NOTE: scoring the answer harness's HELD-OUT questions. Report; do not tune on them.")
    if args.spawn:
        env = dict(kv.split("=", 1) for kv in args.server_env)
        with spawned_server(env, args.server_dir.resolve()) as target:
            return evaluate(args, target)
    return evaluate(args, args.target)


def evaluate(args: argparse.Namespace, target: str) -> int:
    paths = documents.prepare()
    pages = {name: documents.page_texts(path) for name, path in paths.items()}
    questions = [
        q for q in load() if q.answerable and q.doc is not None and args.split in ("all", q.split)
    ]
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    with grpc.insecure_channel(target, options=options) as channel:
        if args.skip_ingest:
            ids = {name: doc_id_for(name) for name in paths}
        else:
            ids = ingest(channel, paths, timeout=1800.0)
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        outcomes = []
        for q in questions:
            rank, hits = ask(stub, q, ids, args.max_results, args.timeout)
            outcomes.append(Outcome(q.id, q.lang, q.split, passage_language(q, pages), rank, hits))
    print(f"{'split':<8} {'group':<6} {'n':>3} {'hit@1':>6} {'hit@3':>6} {'hit@10':>6} {'MRR':>6}")
    rows = summarise(outcomes)
    for r in rows:
        print(
            f"{r['split']:<8} {r['group']:<6} {r['n']:>3} {r['hit@1']:6.3f} {r['hit@3']:6.3f} "
            f"{r['hit@10']:6.3f} {r['mrr']:6.3f}"
        )
    if args.split == "dev":
        for o in outcomes:
            if "mixed" in groups_of(o):
                print(f"  {o.qid} ({o.lang} question, {o.passage_lang} passage): rank {o.rank}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"rows": rows, "questions": [asdict(o) for o in outcomes]},
                ensure_ascii=False,
                indent=1,
            ),
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
