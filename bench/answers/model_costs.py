"""What the model runtime did per Respond, from a run's per-question output (run.py --out).

For each answered question with a real model (telemetry `model_calls` > 0):

* prompt tokens processed = `prompt_tokens - prompt_tokens_cached` over every model call of
  the Respond, against `final_prompt_tokens` (the last call's prompt): with each step
  extending the previous prompt, the runtime's prompt cache keeps the ratio near 1
  (goal <= 1.3);
* mesh overhead = everything but the runtime: (Respond seconds at the client - `llm_runtime_ms`)
  / Respond seconds (goal <= 5 %).

    .venv/bin/python bench/answers/model_costs.py /tmp/ans-local-heldout.full.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

PROCESSED_GOAL = 1.3
OVERHEAD_GOAL = 0.05


def costs(outcome: dict[str, Any]) -> dict[str, float] | None:
    """The ratios of one question's Respond, or None when no model call was made."""
    t = outcome.get("telemetry") or {}
    calls = int(t.get("model_calls") or 0)
    final = int(t.get("final_prompt_tokens") or 0)
    if outcome.get("error") or calls == 0 or final == 0:
        return None
    processed = int(t.get("prompt_tokens") or 0) - int(t.get("prompt_tokens_cached") or 0)
    respond_ms = float(outcome["seconds"]) * 1000
    runtime_ms = float(t.get("llm_runtime_ms") or 0)
    return {
        "calls": calls,
        "processed": processed,
        "final": final,
        "processed_ratio": processed / final,
        "respond_s": respond_ms / 1000,
        "runtime_s": runtime_ms / 1000,
        "overhead": max(0.0, respond_ms - runtime_ms) / respond_ms,
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [c for o in outcomes if (c := costs(o)) is not None]
    if not rows:
        return {"respond_calls": 0}
    ratio = [r["processed_ratio"] for r in rows]
    overhead = [r["overhead"] for r in rows]
    return {
        "respond_calls": len(rows),
        "model_calls_mean": round(statistics.fmean(r["calls"] for r in rows), 2),
        "processed_ratio_mean": round(statistics.fmean(ratio), 3),
        "processed_ratio_p50": round(_pct(ratio, 0.5), 3),
        "processed_ratio_max": round(max(ratio), 3),
        "processed_ratio_within_goal": sum(x <= PROCESSED_GOAL for x in ratio),
        "processed_over_final_total": round(
            sum(r["processed"] for r in rows) / sum(r["final"] for r in rows), 3
        ),
        "overhead_mean": round(statistics.fmean(overhead), 4),
        "overhead_max": round(max(overhead), 4),
        "overhead_total": round(
            1 - sum(r["runtime_s"] for r in rows) / sum(r["respond_s"] for r in rows), 4
        ),
        "overhead_within_goal": sum(x <= OVERHEAD_GOAL for x in overhead),
        "respond_s_mean": round(statistics.fmean(r["respond_s"] for r in rows), 1),
        "respond_s_p50": round(_pct([r["respond_s"] for r in rows], 0.5), 1),
        "respond_s_p95": round(_pct([r["respond_s"] for r in rows], 0.95), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("full", type=Path, nargs="+", help="run.py --out files")
    a = p.parse_args(argv)
    for path in a.full:
        data = json.loads(path.read_text())
        print(f"{path} ({data.get('responder')}, {data.get('split')}, commit {data.get('commit')})")
        for split in ("dev", "heldout"):
            part = [o for o in data["outcomes"] if o.get("split") == split]
            if part:
                s = summarize(part)
                print(f"  {split}: " + json.dumps(s, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
