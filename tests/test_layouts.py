"""Layouts: offsets from sizes and from arbitrary per-response labels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from advcal import groups_from_ids, offsets_from_sizes


def test_offsets_from_sizes_hand_example():
    np.testing.assert_array_equal(offsets_from_sizes([3, 0, 2]), [0, 3, 3, 5])
    assert offsets_from_sizes([3, 0, 2]).dtype == np.int64
    np.testing.assert_array_equal(offsets_from_sizes(np.array([], dtype=int)), [0])


@pytest.mark.parametrize(
    ("sizes", "error", "match"),
    [
        ([1.0, 2.0], TypeError, r"`sizes` must be an integer array; got dtype float64\."),
        ([[1, 2]], ValueError, r"`sizes` must be 1-D; got shape \(1, 2\)\."),
        ([1, -1], ValueError, r"`sizes` must be non-negative\."),
    ],
)
def test_offsets_from_sizes_rejects(sizes, error, match):
    with pytest.raises(error, match=match):
        offsets_from_sizes(sizes)


def test_groups_from_ids_strings_first_appearance_order():
    index = groups_from_ids(["b", "a", "b", "c", "a"])
    np.testing.assert_array_equal(index.offsets, [0, 2, 4, 5])
    np.testing.assert_array_equal(index.order, [0, 2, 1, 4, 3])
    assert list(index.labels) == ["b", "a", "c"]


def test_groups_from_ids_tuples_and_mixed_labels():
    # verl-style uids are strings, but any hashable must work: tuples, mixed types.
    index = groups_from_ids([(1, "x"), (2, "y"), (1, "x")])
    np.testing.assert_array_equal(index.offsets, [0, 2, 3])
    np.testing.assert_array_equal(index.order, [0, 2, 1])
    assert list(index.labels) == [(1, "x"), (2, "y")]
    mixed = groups_from_ids([1, "1", 1.5, "1"])
    np.testing.assert_array_equal(mixed.offsets, [0, 1, 3, 4])
    assert list(mixed.labels) == [1, "1", 1.5]


def test_groups_from_ids_empty():
    index = groups_from_ids([])
    np.testing.assert_array_equal(index.offsets, [0])
    assert index.order.size == 0


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        ("abc", TypeError, r"`group_ids` must be a sequence of labels, not a single string\."),
        (5, TypeError, r"`group_ids` must be a sequence of labels\."),
        (np.zeros((2, 2)), ValueError, r"`group_ids` must be 1-D; got shape \(2, 2\)\."),
        ([1.0, np.nan], ValueError, r"`group_ids` must not contain NaN"),
        ([[1], [2]], TypeError, r"`group_ids` must hold hashable labels; got list at 0\."),
    ],
)
def test_groups_from_ids_rejects(ids, error, match):
    with pytest.raises(error, match=match):
        groups_from_ids(ids)


@given(st.lists(st.integers(0, 5), max_size=60))
def test_groups_from_ids_is_a_stable_grouping(ids):
    index = groups_from_ids(ids)
    ids_arr = np.array(ids, dtype=np.int64)
    grouped = ids_arr[index.order]
    assert sorted(index.order.tolist()) == list(range(len(ids)))
    for q, label in enumerate(index.labels):
        block = slice(index.offsets[q], index.offsets[q + 1])
        assert (grouped[block] == label).all()
        # stable: within a group the caller's relative order is kept
        assert (np.diff(index.order[block]) > 0).all()
    # first appearance order of labels
    seen = list(dict.fromkeys(ids))
    assert list(index.labels) == seen


def test_groups_from_ids_labels_equal_only_with_the_same_type():
    # Python equality merges 1, True and 1.0 (and numpy would turn the list into three
    # equal floats); advcal's rule, as the log readers', keeps them three groups.
    index = groups_from_ids([1, True, 1.0, 1, True, "1"])
    np.testing.assert_array_equal(index.offsets, [0, 2, 4, 5, 6])
    np.testing.assert_array_equal(index.order, [0, 3, 1, 4, 2, 5])
    assert [type(v) for v in index.labels] == [int, bool, float, str]
    # A numpy scalar is the Python type it stands for, as the labels of an array are.
    index = groups_from_ids([np.int64(7), 7, np.float64(0.5), 0.5, np.bool_(True), True])
    np.testing.assert_array_equal(index.offsets, [0, 2, 4, 6])
    # Tuples compare element by element; uniform lists keep numpy's fast path.
    assert groups_from_ids([(1, "a"), (True, "a"), (1, "a")]).offsets.tolist() == [0, 2, 3]
    assert groups_from_ids([1.0, 2.0, 1.0]).labels.dtype == np.float64


def test_grouped_estimators_follow_the_label_rule():
    from advcal import grpo

    rewards = np.array([1.0, 0.0, 3.0, 1.0])
    # True and 1 are two groups of two: (r - mean) / std (ddof=1) is -+1/sqrt(2) in each.
    # One merged group [1, 0, 3, 1] would give (r - 1.25) / 1.258...
    out = grpo(rewards, group_ids=[1, True, 1, True], eps=0.0)
    np.testing.assert_allclose(out, np.array([-1.0, -1.0, 1.0, 1.0]) / np.sqrt(2.0),
                               rtol=1e-15)
