"""Hybrid score fusion: per-list score normalisation, weighted sums and reciprocal rank fusion.

Dense (cosine) and BM25 scores live on different scales, so a weighted sum of raw scores
lets whichever list has the larger numbers win (docs/architecture.md §6). Each list is normalised on
its own first; RRF, which ignores scores and uses ranks only, is offered as the
alternative. Keys are anything hashable (chunk ids, section ids, ...).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from operator import itemgetter, neg
from typing import Any, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)

NORMALISERS = ("minmax", "zscore", "max", "none")
FUSIONS = ("weighted", "rrf")
"""The ways the dense and BM25 lists are fused (RETR_FUSION, a search's params.fusion)."""
DEFAULT_RRF_K = 60


def normalise(scores: Sequence[float], method: str = "minmax") -> list[float]:
    """Scores of one result list mapped onto a common scale, in the same order.

    - ``minmax``: ``(s - min) / (max - min)`` into [0, 1]. When every score is equal
      (including a single result) each maps to 1.0: it is the best its retriever found,
      and mapping it to 0 would silently drop a lone hit from the fusion.
    - ``zscore``: ``(s - mean) / stdev`` (population); all equal -> 0.0 each.
    - ``max``: ``s / max`` for non-negative scores such as BM25 (keeps the ratio between
      a strong and a weak hit); when the maximum is not positive it falls back to minmax.
    - ``none``: the scores unchanged.

    Non-finite scores (NaN, ±inf) are left out of the statistics and map to 0.0.
    An empty input gives an empty list.
    """
    if method not in NORMALISERS:
        raise ValueError(f"unknown normalisation {method!r}; expected one of {NORMALISERS}")
    values = [float(s) for s in scores]
    if method == "none":
        return values
    if method == "minmax" and values and math.isfinite(sum(values)):
        # Every score finite (a NaN or an infinity makes the sum non-finite; so does an
        # overflow, which takes the general path below): no per-score checks.
        low, high = min(values), max(values)
        span = high - low
        if span == 0:
            return [1.0] * len(values)
        return [(v - low) / span for v in values]
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return [0.0] * len(values)
    if method == "max":
        top = max(finite)
        if top > 0:
            return [v / top if math.isfinite(v) else 0.0 for v in values]
        method = "minmax"
    if method == "minmax":
        low, high = min(finite), max(finite)
        span = high - low
        if span == 0:
            return [1.0 if math.isfinite(v) else 0.0 for v in values]
        return [(v - low) / span if math.isfinite(v) else 0.0 for v in values]
    mean = sum(finite) / len(finite)
    stdev = math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite))
    if stdev == 0:
        return [0.0] * len(values)
    return [(v - mean) / stdev if math.isfinite(v) else 0.0 for v in values]


def _best_scores(items: Sequence[tuple[K, float]]) -> dict[K, float]:
    """One score per key (the highest when a list repeats a key), in first-seen order."""
    unique = dict(items)
    if len(unique) == len(items):  # no key repeats (an index's own list): built in C
        return unique
    best: dict[K, float] = {}
    for key, score in items:
        value = float(score)
        if key not in best or value > best[key]:
            best[key] = value
    return best


def _sort_fused(scores: dict[K, float], best_rank: dict[K, int]) -> list[tuple[K, float]]:
    # Ties: the key ranked higher in any single list first, then its text, so the order
    # never depends on dict or backend iteration order. str(key) only inside runs that tie
    # on both (rare): for point-id keys it was a third of the fusion's cost.
    decorated = sorted(
        zip(map(neg, scores.values()), map(best_rank.__getitem__, scores), scores, strict=True),
        key=itemgetter(0, 1),  # keys themselves need not be orderable
    )
    n = len(decorated)
    if n > 1 and len({d[:2] for d in decorated}) < n:  # some run ties on (score, rank)
        i = 0
        while i < n:
            j = i + 1
            while j < n and decorated[j][:2] == decorated[i][:2]:
                j += 1
            if j - i > 1:
                decorated[i:j] = sorted(decorated[i:j], key=lambda d: str(d[2]))
            i = j
    return [(key, -negated) for negated, _, key in decorated]


def _check_weights(names: Sequence[str], weights: Mapping[str, float]) -> None:
    missing = [name for name in names if name not in weights]
    if missing:
        raise ValueError(f"no weight for result list(s) {missing}")
    negative = [name for name in names if weights[name] < 0 or not math.isfinite(weights[name])]
    if negative:
        raise ValueError(f"weights must be finite and non-negative: {negative}")


def weighted_fusion(
    ranked: Mapping[str, Sequence[tuple[K, float]]],
    weights: Mapping[str, float],
    *,
    method: str = "minmax",
) -> list[tuple[K, float]]:
    """Each list normalised with ``method``, then ``sum(weight * normalised)`` per key.

    ``ranked`` maps a list name (``"dense"``, ``"sparse"``) to ``(key, raw_score)`` pairs;
    every name needs a weight. A key missing from a list gets 0 from that list. A key
    repeated within one list counts once, with its best score. The result has one entry
    per key, sorted by fused score descending; ties go to the key with the better rank
    in any single list, then to ``str(key)``.
    """
    _check_weights(list(ranked), weights)
    if method == "minmax":
        fast = _weighted_minmax_ids(ranked, weights)
        if fast is not None:
            return fast
    return _weighted_loop(ranked, weights, method)


def _weighted_loop(
    ranked: Mapping[str, Sequence[tuple[K, float]]],
    weights: Mapping[str, float],
    method: str,
) -> list[tuple[K, float]]:
    """weighted_fusion for any keys and normaliser (weights already checked)."""
    fused: dict[K, float] = {}
    best_rank: dict[K, int] = {}
    for name, items in ranked.items():
        best = _best_scores(items)
        weight = weights[name]
        # Best first; reverse=True keeps equal scores in input order (a stable sort).
        order = sorted(
            zip(normalise(list(best.values()), method), best, strict=True),
            key=itemgetter(0),
            reverse=True,
        )
        rank, previous = 0, None
        for position, (value, key) in enumerate(order):
            # Competition ranking: equal scores share a rank, so input order cannot matter.
            if value != previous:
                rank, previous = position, value
            fused[key] = fused.get(key, 0.0) + weight * value
            if best_rank.get(key, rank) >= rank:
                best_rank[key] = rank
    return _sort_fused(fused, best_rank)


def _weighted_minmax_ids(
    ranked: Mapping[str, Sequence[tuple[Any, float]]], weights: Mapping[str, float]
) -> list[tuple[Any, float]] | None:
    """weighted_fusion's minmax case in numpy, for lists of unique integer keys (an index's
    point ids) with finite scores: the same floats in the same order (each key's sum is
    accumulated list by list, as the loop does), at about a third of the loop's time for two
    100-entry lists. None, for the loop to answer, when a key repeats within a list or a key
    or score does not fit (not an int in 0..2^64-1, not finite).
    """
    keys_parts, values_parts, ranks_parts = [], [], []
    for name, items in ranked.items():
        n = len(items)
        if n == 0:
            continue
        ids, scores = zip(*items, strict=True)
        if not all(type(k) is int for k in ids):  # numpy would turn 1.5 or "7" into a key
            return None
        if len(set(ids)) != n:  # a key repeated within one list: the loop keeps its best
            return None
        try:
            keys = np.fromiter(ids, dtype=np.uint64, count=n)
            raw = np.array(scores, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):  # outside 0..2^64-1, or not a number
            return None
        low, high = raw.min(), raw.max()
        if not (math.isfinite(low) and math.isfinite(high)):
            return None
        span = high - low
        # normalise()'s minmax, element for element: (v - low) / span, or 1.0 when all equal.
        values = np.ones(n) if span == 0 else (raw - low) / span
        # Competition rank in best-first order (a stable sort: equal values keep input order,
        # and share the rank of the first of them).
        order = np.argsort(-values, kind="stable")
        ordered = values[order]
        starts = np.empty(n, dtype=bool)
        starts[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
        positions = np.where(starts, np.arange(n), 0)
        ranks = np.empty(n, dtype=np.int64)
        ranks[order] = np.maximum.accumulate(positions)
        keys_parts.append(keys)
        values_parts.append(weights[name] * values)
        ranks_parts.append(ranks)
    if not keys_parts:
        return []
    unique, inverse = np.unique(np.concatenate(keys_parts), return_inverse=True)
    # bincount adds each bin's weights in input order: 0.0 + first list's + second list's.
    fused = np.bincount(inverse, weights=np.concatenate(values_parts), minlength=len(unique))
    best = np.full(len(unique), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, inverse, np.concatenate(ranks_parts))
    order = np.lexsort((best, -fused))
    s, r = fused[order], best[order]
    pairs = list(zip(unique[order].tolist(), s.tolist(), strict=True))
    tied = np.flatnonzero((s[1:] == s[:-1]) & (r[1:] == r[:-1]))
    # Runs that tie on score and best rank (the bottom entries of equal-length lists all
    # score 0.0 at the same rank) go by str(key), as in _sort_fused.
    i = 0
    while i < len(tied):
        start = end = int(tied[i])
        while i < len(tied) and tied[i] == end:
            end, i = end + 1, i + 1
        pairs[start : end + 1] = sorted(pairs[start : end + 1], key=lambda kv: str(kv[0]))
    return pairs


def rrf_fusion(
    ranked: Mapping[str, Sequence[K]],
    k: int = DEFAULT_RRF_K,
    weights: Mapping[str, float] | None = None,
) -> list[tuple[K, float]]:
    """Reciprocal rank fusion: ``score(key) = sum(weight / (k + rank))``, ranks from 1.

    ``ranked`` maps a list name to keys in rank order (best first); a key repeated
    within a list counts at its first (best) rank only. ``weights`` defaults to 1.0 for
    every list. Sorted like :func:`weighted_fusion`.
    """
    if k < 0:
        raise ValueError(f"RRF k must be non-negative, got {k}")
    if weights is not None:
        _check_weights(list(ranked), weights)
    fused: dict[K, float] = {}
    best_rank: dict[K, int] = {}
    for name, keys in ranked.items():
        weight = 1.0 if weights is None else weights[name]
        seen: set[K] = set()
        rank = 0
        for key in keys:
            if key in seen:
                continue
            seen.add(key)
            rank += 1
            fused[key] = fused.get(key, 0.0) + weight / (k + rank)
            best_rank[key] = min(best_rank.get(key, rank), rank)
    return _sort_fused(fused, best_rank)


def impute_cross_language(
    dense: Sequence[tuple[K, float]],
    sparse: Sequence[tuple[K, float]],
    languages: Mapping[K, str],
    query_language: str,
) -> list[tuple[K, float]]:
    """The keyword (BM25) list with evidence filled in for the dense list's candidates written
    in the other language than the query, best first.

    BM25 matches words, so a Russian question scores an English passage only on the Latin
    words they share (a command, a version), however well the passage answers it: next to
    passages in the query's language it loses the keyword share of every fusion by
    construction, not on its merits. Such a candidate's keyword score becomes the larger of
    its own and its dense score mapped onto the keyword list's range (``low + d * (high -
    low)``, ``d`` its min-max normalised dense score), so after min-max normalisation its
    keyword share is ``max(s, d)``: the dense list, which sees across languages, speaks for
    it. Candidates in the query's language, of mixed or unknown language, and every
    candidate when the query is neither ``ru`` nor ``en`` keep their scores, so a
    monolingual corpus ranks exactly as before. An empty keyword list stays empty: there is
    no keyword evidence for anyone to be compared with.

    ``languages`` maps a key to ``ru``/``en``/``mixed``/``other`` (missing: unknown).
    """
    if query_language not in ("ru", "en") or not dense or not sparse:
        return list(sparse)
    other = "en" if query_language == "ru" else "ru"
    best = _best_scores(sparse)
    finite = [v for v in best.values() if math.isfinite(v)]
    if not finite:
        return list(sparse)
    low, high = min(finite), max(finite)
    if high <= low:  # one score for all: fill in below it, in proportion
        low = min(0.0, low)
    dense_best = _best_scores(dense)
    changed = False
    for key, d in zip(dense_best, normalise(list(dense_best.values())), strict=True):
        if languages.get(key) != other:
            continue
        imputed = low + d * (high - low)
        if imputed > best.get(key, -math.inf):
            best[key] = imputed
            changed = True
    if not changed:
        return list(sparse)
    return sorted(best.items(), key=lambda kv: -kv[1])  # stable: ties keep list order


def add_exact_matches(
    fused: Sequence[tuple[K, float]], exact: Sequence[tuple[K, float]], weight: float
) -> list[tuple[K, float]]:
    """`fused` (scores in [0, 1]) with the list `exact` added at `weight`, back in [0, 1].

    `exact` is a ranking of the keys that match some exact terms (BM25 of a query's
    abbreviations alone), normalised by its best score (``max``: every key in it matched, so
    none maps to 0 as minmax would map the last). Each key's score becomes
    ``(fused + weight * exact) / (1 + weight)``; a key only in `exact` enters the result.
    """
    if not exact:
        return list(fused)
    if weight < 0 or not math.isfinite(weight):
        raise ValueError(f"weight must be finite and non-negative, got {weight!r}")
    best = _best_scores(exact)
    scores = dict(fused)
    ranks = {key: rank for rank, (key, _) in enumerate(fused)}
    for key, value in zip(best, normalise(list(best.values()), "max"), strict=True):
        scores[key] = scores.get(key, 0.0) + weight * value
    for rank, key in enumerate(best):
        ranks[key] = min(ranks.get(key, rank), rank)
    scale = 1.0 + weight
    return _sort_fused({k: v / scale for k, v in scores.items()}, ranks)
