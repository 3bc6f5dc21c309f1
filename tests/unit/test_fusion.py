"""Hybrid fusion maths: normalisation, weighted sums and RRF against hand-computed numbers."""

import math

import pytest

from services.retrieval.fusion import (
    normalise,
    rrf_fusion,
    weighted_fusion,
)


def approx_pairs(actual, expected):
    assert [k for k, _ in actual] == [k for k, _ in expected]
    for (_, a), (_, e) in zip(actual, expected, strict=True):
        assert a == pytest.approx(e)


def test_minmax_maps_onto_zero_one():
    assert normalise([2.0, 4.0, 10.0]) == pytest.approx([0.0, 0.25, 1.0])


def test_minmax_degenerate_cases():
    assert normalise([]) == []
    assert normalise([0.37]) == [1.0]
    assert normalise([3.0, 3.0, 3.0]) == [1.0, 1.0, 1.0]


def test_zscore_uses_population_deviation():
    # mean 2, population stdev sqrt(2/3)
    sd = math.sqrt(2 / 3)
    assert normalise([1.0, 2.0, 3.0], "zscore") == pytest.approx([-1 / sd, 0.0, 1 / sd])
    assert normalise([5.0], "zscore") == [0.0]
    assert normalise([5.0, 5.0], "zscore") == [0.0, 0.0]


def test_max_keeps_ratios_and_falls_back_for_non_positive_maxima():
    assert normalise([8.0, 2.0, 0.0], "max") == pytest.approx([1.0, 0.25, 0.0])
    assert normalise([-1.0, -3.0], "max") == pytest.approx([1.0, 0.0])


def test_non_finite_scores_are_ignored_and_map_to_zero():
    assert normalise([1.0, math.nan, 3.0]) == pytest.approx([0.0, 0.0, 1.0])
    assert normalise([math.inf]) == [0.0]


def test_unknown_normaliser_is_refused():
    with pytest.raises(ValueError):
        normalise([1.0], "softmax")


def test_weighted_fusion_normalises_each_list_before_weighting():
    dense = [("a", 0.82), ("b", 0.80), ("c", 0.70)]  # -> a 1.0, b 10/12, c 0
    sparse = [("c", 12.0), ("a", 3.0), ("d", 6.0)]  # -> c 1.0, a 0, d 1/3
    fused = weighted_fusion({"dense": dense, "sparse": sparse}, {"dense": 0.7, "sparse": 0.3})
    approx_pairs(
        fused,
        [("a", 0.7), ("b", 0.7 * 10 / 12), ("c", 0.3), ("d", 0.1)],
    )


def test_weighted_fusion_raw_bm25_would_have_dominated():
    # With raw scores "c" (BM25 12) would win; normalised, dense's best "a" wins.
    fused = weighted_fusion(
        {"dense": [("a", 0.9), ("c", 0.1)], "sparse": [("c", 12.0), ("a", 11.0)]},
        {"dense": 0.7, "sparse": 0.3},
    )
    assert fused[0][0] == "a"


def test_weighted_fusion_dedupes_repeated_keys_with_their_best_score():
    fused = weighted_fusion({"dense": [("a", 0.2), ("b", 0.5), ("a", 0.9)]}, {"dense": 1.0})
    approx_pairs(fused, [("a", 1.0), ("b", 0.0 + (0.5 - 0.5) / 0.4)])


def test_weighted_fusion_ties_are_broken_by_rank_then_key():
    # x, y, z all end at 0.5 and all share rank 1 in some list (x and z tie in dense):
    # the key decides, whatever the input order.
    fused = weighted_fusion(
        {"dense": [("z", 1.0), ("x", 1.0), ("w", 0.0)], "sparse": [("y", 5.0), ("w", 1.0)]},
        {"dense": 0.5, "sparse": 0.5},
    )
    approx_pairs(fused, [("x", 0.5), ("y", 0.5), ("z", 0.5), ("w", 0.0)])
    # Same input in a different dict order gives the same output.
    again = weighted_fusion(
        {"sparse": [("y", 5.0), ("w", 1.0)], "dense": [("z", 1.0), ("x", 1.0), ("w", 0.0)]},
        {"dense": 0.5, "sparse": 0.5},
    )
    assert again == fused


def test_weighted_fusion_requires_a_weight_per_list():
    with pytest.raises(ValueError):
        weighted_fusion({"dense": [("a", 1.0)], "sparse": []}, {"dense": 1.0})
    with pytest.raises(ValueError):
        weighted_fusion({"dense": [("a", 1.0)]}, {"dense": -1.0})


def test_weighted_fusion_of_nothing_is_empty():
    assert weighted_fusion({"dense": [], "sparse": []}, {"dense": 0.7, "sparse": 0.3}) == []


def test_rrf_sums_reciprocal_ranks():
    fused = rrf_fusion({"dense": ["a", "b", "c"], "sparse": ["c", "a"]}, k=60)
    approx_pairs(
        fused,
        [("a", 1 / 61 + 1 / 62), ("c", 1 / 63 + 1 / 61), ("b", 1 / 62)],
    )


def test_rrf_weights_and_small_k():
    fused = rrf_fusion(
        {"dense": ["a", "b"], "sparse": ["b"]}, k=0, weights={"dense": 1, "sparse": 2}
    )
    approx_pairs(fused, [("b", 1 / 2 + 2 / 1), ("a", 1.0)])


def test_rrf_counts_a_repeated_key_once_at_its_best_rank():
    fused = rrf_fusion({"dense": ["a", "a", "b"]}, k=1)
    approx_pairs(fused, [("a", 1 / 2), ("b", 1 / 3)])


def test_rrf_rejects_negative_k():
    with pytest.raises(ValueError):
        rrf_fusion({"dense": ["a"]}, k=-1)


# --- the numpy path for an index's point ids ------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from services.retrieval.fusion import _weighted_loop, _weighted_minmax_ids  # noqa: E402
from tests.unit.properties import FAST  # noqa: E402

U64 = 2**64 - 1
# Few distinct keys and scores, so lists overlap, repeat keys and tie on scores.
point_ids = st.one_of(st.integers(0, 12), st.sampled_from([2**63 - 1, 2**63, U64]))
scores = st.one_of(
    st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]),
    st.floats(-5, 30, allow_nan=False, allow_infinity=False),
)
ranked_lists = st.dictionaries(
    st.sampled_from(["dense", "sparse", "variant"]),
    st.lists(st.tuples(point_ids, scores), max_size=12),
    min_size=1,
)
weight_values = st.sampled_from([0.0, 0.3, 0.5, 0.7, 1, 2.5])


@settings(FAST, max_examples=600)
@given(ranked_lists, st.data())
def test_numpy_path_equals_the_loop_exactly(ranked, data):
    weights = {name: data.draw(weight_values) for name in ranked}
    fast = _weighted_minmax_ids(ranked, weights)
    loop = _weighted_loop(ranked, weights, "minmax")
    if fast is not None:  # same keys, same floats (not approximately), same order
        assert fast == loop
        assert [type(k) for k, _ in fast] == [int] * len(fast)
    assert weighted_fusion(ranked, weights) == loop


def test_numpy_path_answers_an_index_shaped_fusion():
    """Unique point ids per list, distinct scores: the case the engine sends it, every search."""
    dense = [(10**18 + i, 0.9 - i / 100) for i in range(100)]
    sparse = [(10**18 + 2 * i, 14.0 - i / 7) for i in range(100)]
    ranked = {"dense": dense, "sparse": sparse}
    weights = {"dense": 0.7, "sparse": 0.3}
    fast = _weighted_minmax_ids(ranked, weights)
    assert fast is not None and fast == _weighted_loop(ranked, weights, "minmax")
    assert len(fast) == 150 and fast[0] == (10**18, 1.0)


@pytest.mark.parametrize(
    "ranked",
    [
        {"a": [(1, 0.5), (1, 0.7)]},  # a key repeated within a list
        {"a": [(-1, 0.5), (2, 0.4)]},  # not an unsigned 64-bit id
        {"a": [(2**64, 0.5), (2, 0.4)]},
        {"a": [(1.5, 0.5), (2, 0.4)]},  # not an int at all
        {"a": [("7", 0.5), (2, 0.4)]},
        {"a": [(True, 0.5), (2, 0.4)]},
        {"a": [(("d", "s"), 0.5), (2, 0.4)]},
        {"a": [(1, math.inf), (2, 0.4)]},  # not finite
        {"a": [(1, math.nan), (2, 0.4)]},
    ],
)
def test_numpy_path_declines_what_only_the_loop_answers(ranked):
    weights = {"a": 1.0}
    assert _weighted_minmax_ids(ranked, weights) is None
    assert weighted_fusion(ranked, weights) == _weighted_loop(ranked, weights, "minmax")


def test_ties_on_score_and_rank_go_by_the_keys_text():
    # 9 and 10 tie at rank 0 (both 1.0), 100 and 20 at the bottom (0.0, rank 1): "10" < "9"
    # and "100" < "20" as text, not as numbers.
    ranked = {"a": [(9, 5.0), (100, 1.0)], "b": [(10, 3.0), (20, 2.0)]}
    weights = {"a": 1.0, "b": 1.0}
    want = [(10, 1.0), (9, 1.0), (100, 0.0), (20, 0.0)]
    assert _weighted_loop(ranked, weights, "minmax") == want
    assert _weighted_minmax_ids(ranked, weights) == want


def test_empty_lists_fuse_to_nothing():
    assert _weighted_minmax_ids({"a": [], "b": []}, {"a": 1.0, "b": 1.0}) == []
    assert weighted_fusion({"a": []}, {"a": 1.0}) == []
