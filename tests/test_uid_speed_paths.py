"""groups_from_ids's fast paths (string uids by object address, runs of equal labels, radix
orders) give exactly the GroupIndex of the label rule: offsets, order, labels, label types."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import advcal
from advcal import layouts
from advcal.layouts import groups_from_ids, label_key


def reference(ids: Any) -> tuple[list[int], list[int], list[Any]]:
    """The label rule by brute force: groups in order of first appearance, each group's
    responses in the caller's order, each group labelled by its first label."""
    items = list(ids)
    code_of: dict[Any, int] = {}
    labels: list[Any] = []
    codes = []
    for label in items:
        key = label_key(label)
        if key not in code_of:
            code_of[key] = len(code_of)
            labels.append(label)
        codes.append(code_of[key])
    order = sorted(range(len(items)), key=lambda i: (codes[i], i))
    sizes = [codes.count(q) for q in range(len(labels))]
    return [0, *np.cumsum(sizes, dtype=np.int64).tolist()], order, labels


def assert_reference(ids: Any, index: advcal.GroupIndex | None = None) -> advcal.GroupIndex:
    index = groups_from_ids(ids) if index is None else index
    offsets, order, labels = reference(ids)
    assert index.offsets.dtype == np.int64 and index.order.dtype == np.int64
    assert index.offsets.tolist() == offsets
    assert index.order.tolist() == order
    assert len(index.labels) == len(labels)
    if index.labels.dtype == object:
        for got, want in zip(index.labels, labels, strict=True):
            assert got is want  # the first label itself, so of its own type
    else:  # a list of one numeric type is grouped as a numpy array
        assert not isinstance(ids, np.ndarray) or ids.dtype == index.labels.dtype
        assert [label_key(v) for v in index.labels] == [label_key(v) for v in labels]
    return index


def fresh(text: str) -> str:
    """An equal string that is another object (never interned)."""
    copy = "".join(list(text))
    assert copy == text and (copy is not text or len(text) < 2)
    return copy


def verl_uids(prompts: int, n: int, seed: int = 0, shuffled: bool = False) -> np.ndarray:
    uids = np.repeat(np.array([str(uuid.UUID(int=int(v), version=4)) for v in
                               np.random.default_rng(seed).integers(0, 2**62, prompts)],
                              dtype=object), n)
    return uids[np.random.default_rng(seed + 1).permutation(uids.size)] if shuffled else uids


def plain_path(ids: Any) -> advcal.GroupIndex:
    index = layouts._groups_of_plain_strings(ids)
    assert index is not None, "the plain-string path was not taken"
    return index


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("container", ["object array", "list", "tuple"])
@pytest.mark.parametrize(("prompts", "n"), [(1, 1), (1, 5), (7, 1), (50, 8), (700, 16)])
def test_verl_uids_take_the_plain_path_and_match_the_rule(shuffled, container, prompts, n):
    uids = verl_uids(prompts, n, shuffled=shuffled)
    ids = {"object array": uids, "list": uids.tolist(), "tuple": tuple(uids.tolist())}[container]
    index = assert_reference(ids, plain_path(ids))
    general = layouts._groups_by_rule(ids)
    for got, want in zip(index, general, strict=True):
        np.testing.assert_array_equal(got, want)
    assert_reference(ids)
    if not shuffled:  # contiguous groups keep the caller's order
        assert index.order.tolist() == list(range(uids.size))


def test_distinct_objects_with_equal_values_are_one_group():
    a, b = "uid-a", "uid-b"
    for ids in ([a, a, b, b, fresh(a), fresh(a), fresh(b)],  # runs of equal values
                [a, fresh(b), fresh(a), b, a, fresh(b)],  # no runs
                [fresh(a) for _ in range(9)] + [b, fresh(b)]):  # every object distinct
        for container in (ids, np.array(ids, dtype=object)):
            index = assert_reference(container, plain_path(container))
            assert len(index.labels) == len(set(ids))


@pytest.mark.parametrize("labels", [
    ["", "", "a", ""],  # empty strings
    ["é", "e\u0301", "é", "🙂", "e\u0301", "\x00", "a\x00", "a"],  # unicode, NUL: distinct
    ["x" * 10_000, "x" * 9_999 + "y", "x" * 10_000, fresh("x" * 10_000)],  # very long
    [b"a", b"", b"a\x00", b"a", b"\xff"],  # bytes
])
def test_edge_strings(labels):
    for ids in (labels, tuple(labels), np.array(labels, dtype=object)):
        assert_reference(ids, plain_path(ids))
        assert_reference(ids)


@pytest.mark.parametrize("labels", [
    ["1", 1, "1", 1],
    [1, True, 1.0, "1", 1, True, 1.0, "1"],
    ["a", None, "a", None],
    ["a", b"a", "a", b"a"],  # str and bytes: two types, the general path
    ["a", np.str_("a"), "a"],  # a numpy scalar is the type it stands for
    ["a", ("a",), "a"],
    [None, None],
])
def test_mixed_labels_fall_back_to_the_rule(labels):
    for ids in (labels, np.array(labels + [object()], dtype=object)[:-1]):
        if type(ids) is np.ndarray or type(ids[0]) in (str, bytes):
            assert layouts._groups_of_plain_strings(ids) is None
        assert_reference(ids)


def test_a_str_subclass_is_its_own_type():
    class Uid(str):
        pass

    ids = ["a", Uid("a"), "a", Uid("a")]
    index = assert_reference(ids)
    assert [type(v) for v in index.labels] == [str, Uid]
    assert index.offsets.tolist() == [0, 2, 4]


@pytest.mark.parametrize(("ids", "error", "match"), [
    (["a", ["b"], "a"], TypeError, r"`group_ids` must hold hashable labels; got list at 1\."),
    (np.array(["a", {}, "b"], dtype=object), TypeError,
     r"`group_ids` must hold hashable labels; got dict at 1\."),
    (["a", float("nan")], ValueError, r"`group_ids` must not contain NaN"),
    (np.array([["a", "b"]], dtype=object), ValueError,
     r"`group_ids` must be 1-D; got shape \(1, 2\)\."),
    (np.array("a", dtype=object), TypeError, r"`group_ids` must be a sequence of labels\."),
])
def test_bad_labels_keep_their_messages(ids, error, match):
    with pytest.raises(error, match=match):
        groups_from_ids(ids)


def test_the_callers_array_is_left_alone():
    uids = verl_uids(40, 8, shuffled=True)
    for ids in (uids, uids[::2], uids[::-1]):
        before = ids.copy()
        writeable = ids.flags.writeable
        groups_from_ids(ids)
        advcal.grpo(np.linspace(0, 1, ids.size), group_ids=ids)
        assert ids.flags.writeable == writeable
        assert all(a is b for a, b in zip(ids, before, strict=True))
    as_list = uids.tolist()
    copy = list(as_list)
    groups_from_ids(as_list)
    assert all(a is b for a, b in zip(as_list, copy, strict=True))


def test_views_and_read_only_arrays():
    uids = verl_uids(30, 4)
    frozen = uids.copy()
    frozen.flags.writeable = False
    for ids in (uids[::3], uids[::-1], frozen, uids[5:-5]):
        assert_reference(ids, plain_path(ids))


def unique_reference(ids: np.ndarray) -> advcal.GroupIndex:
    """The typed arrays' grouping by np.unique, as groups_from_ids computed it before."""
    labels, first, codes = np.unique(ids, return_index=True, return_inverse=True)
    by_appearance = np.argsort(first, kind="stable")
    rank = np.empty_like(by_appearance)
    rank[by_appearance] = np.arange(by_appearance.size)
    codes = rank[codes.reshape(-1)]
    order = np.argsort(codes, kind="stable")
    return advcal.GroupIndex(advcal.offsets_from_sizes(np.bincount(codes)), order,
                             labels[by_appearance])


def assert_typed(ids: np.ndarray) -> None:
    got, want = groups_from_ids(ids), unique_reference(ids)
    assert got.labels.dtype == ids.dtype
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert got.order.dtype == np.int64 and got.offsets.dtype == np.int64


@pytest.mark.parametrize("shuffled", [False, True])
def test_numpy_string_arrays(shuffled):
    uids = verl_uids(300, 8, shuffled=shuffled)
    assert_typed(uids.astype(str))
    assert_typed(uids.astype(str).astype(np.bytes_))
    # U and S arrays drop trailing NULs: "a" and "a\0" are one label there
    assert_typed(np.array(["a", "a\x00", "", "\x00", "é", "a"]))
    assert_typed(np.array([b"a", b"a\x00", b"", b"\x00", b"a"]))
    assert_typed(np.array(["x" * 5000, "x" * 4999, "x" * 5000]))


@given(st.lists(st.integers(-3, 3), max_size=80), st.sampled_from([np.int8, np.int64, np.uint16,
                                                                    np.float64, np.bool_]))
def test_numeric_arrays_match_np_unique(values, dtype):
    assert_typed(np.array(values).astype(dtype))


def test_signed_zeros_and_dates():
    for values in ([0.0, -0.0, 1.0, -0.0, 0.0], [-0.0, 0.0, 1.0], [1.0, -0.0, -0.0, 0.0]):
        ids = np.array(values)
        assert_typed(ids)
        # -0.0 == 0.0: one group, labelled by its first response, sign included
        np.testing.assert_array_equal(np.signbit(groups_from_ids(ids).labels),
                                      np.signbit(unique_reference(ids).labels))
    dates = np.array(["2024-01-01", "NaT", "2024-01-01", "NaT", "NaT"], dtype="datetime64[D]")
    assert_typed(dates)


string_pool = st.sampled_from(["", "a", "b", "é", "🙂", "a\x00", "uid-0", "x" * 300])
any_label = st.one_of(string_pool, st.integers(-2, 2), st.booleans(), st.sampled_from([1.0, 0.5]),
                      st.none(), st.binary(max_size=2), st.tuples(st.integers(0, 1)))


@given(st.lists(st.tuples(string_pool, st.booleans()), max_size=60), st.booleans())
def test_strings_with_shared_and_fresh_objects(draws, as_array):
    ids = [fresh(s) if copy else s for s, copy in draws]
    container = np.array(ids + [None], dtype=object)[:-1] if as_array else ids
    index = assert_reference(container)
    if ids:
        assert_reference(container, plain_path(container))
        for got, want in zip(index, layouts._groups_by_rule(container), strict=True):
            np.testing.assert_array_equal(got, want)


@given(st.lists(any_label, max_size=60), st.booleans())
def test_any_labels_match_the_rule(ids, as_array):
    container: Any = np.empty(len(ids), dtype=object) if as_array else ids
    if as_array:
        for i, label in enumerate(ids):
            container[i] = label
    assert_reference(container)


@given(st.lists(st.integers(0, 2**20), max_size=200), st.integers(0, 40))
def test_radix_argsort_is_the_stable_argsort(values, shift):
    keys = np.array(values, dtype=np.int64) << shift
    bound = int(keys.max()) + 1 if keys.size else 1
    np.testing.assert_array_equal(layouts._radix_argsort(keys, bound),
                                  np.argsort(keys, kind="stable"))
    codes = np.array(values, dtype=np.intp)
    order = layouts._grouping_order(codes, int(codes.max()) + 1 if codes.size else 0)
    np.testing.assert_array_equal(order, np.argsort(codes, kind="stable"))
    assert order.dtype == np.int64


@given(st.lists(st.integers(0, 50), min_size=1, max_size=300),
       st.sampled_from([1, 16, 2**20, 2**40, 2**58]), st.integers(0, 2**45))
def test_first_appearance_codes_dense_and_sparse_keys(values, step, base):
    # steps 1 and 16 fill a table; larger ones spread the keys (odd multiples: no common
    # low zero bits to drop), so they are sorted: by 16-bit digits, or past 2**48 compared
    keys = np.array(values, dtype=np.uint64) * np.uint64(step + 1) + np.uint64(base)
    codes, firsts, by_key = layouts._first_appearance_codes(keys)
    seen: dict[int, int] = {}
    want = [seen.setdefault(v, len(seen)) for v in values]
    assert codes.tolist() == want
    assert firsts.tolist() == [values.index(v) for v in seen]
    assert by_key.tolist() == [values.index(v) for v in sorted(seen)]
