"""Calibration artefacts: exact round trips, validation of files and of objects built by hand."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import zipfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import advcal
from advcal import (
    RangeCalibration,
    SetCalibration,
    ThresholdSelection,
    calibrate_ranges,
    calibrate_sets,
    coefficient_sets,
    conformal_quantile,
    grpo,
    load_calibration,
    save_calibration,
    select_threshold,
    setgrpo,
)
from advcal.io.artefacts import FORMAT_VERSION
from advcal.labels import LabelMapping
from advcal.simulate import gram_matrices, paired_scorings

# --------------------------------------------------------------------------- helpers


def assert_identical(a: Any, b: Any, where: str = "") -> None:
    """Same type and bits, recursively (arrays: dtype, shape, bytes; floats: sign of 0)."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if a.dtype == object:
            assert_identical(a.tolist(), b.tolist(), where)
        else:
            assert a.tobytes() == b.tobytes(), where
        assert a.flags.writeable == b.flags.writeable, where
    elif isinstance(a, float):
        assert a == b or (math.isnan(a) and math.isnan(b)), where
        assert math.copysign(1, a) == math.copysign(1, b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, (dict, MappingProxyType)):
        assert list(a) == list(b), where
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            assert_identical(ka, kb, f"{where} key")
            assert_identical(va, vb, f"{where}[{ka!r}]")
    elif dataclasses.is_dataclass(a) or isinstance(a, tuple):
        pass
    else:
        assert a == b, where
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            assert_identical(getattr(a, f.name), getattr(b, f.name), f.name)
    if isinstance(a, ThresholdSelection):
        for name in a._fields:
            assert_identical(getattr(a, name), getattr(b, name), name)


def round_trip(obj: Any, path: Path) -> Any:
    save_calibration(path, obj)
    back = load_calibration(path, kind=type(obj))
    assert_identical(obj, back)
    return back


def rewrite(path: Path, *, header: Any = None, members: dict[str, bytes] | None = None,
            drop: tuple[str, ...] = ()) -> None:
    """Rewrite a saved file with a changed header (a function of the parsed JSON) and
    changed or added raw members."""
    with zipfile.ZipFile(path) as zf:
        contents = {name: zf.read(name) for name in zf.namelist()}
    if header is not None:
        parsed = json.loads(contents["header.json"])
        header(parsed)
        contents["header.json"] = json.dumps(parsed).encode()
    contents.update(members or {})
    for name in drop:
        del contents[name]
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in contents.items():
            zf.writestr(name, data)


def npy(arr: np.ndarray, *, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=allow_pickle)
    return buf.getvalue()


@pytest.fixture(scope="module")
def set_cal() -> SetCalibration:
    pair = paired_scorings(300, 6, scale=0.03, seed=0)
    return calibrate_sets(pair.a, pair.b, alpha=0.1)


@pytest.fixture(scope="module")
def selection(set_cal: SetCalibration) -> ThresholdSelection:
    data = paired_scorings(200, 6, scale=0.03, seed=1)
    sets = coefficient_sets(data.a, calibration=set_cal)
    return select_threshold(sets, gram_matrices(200, 6, seed=2).gram, grpo(data.b),
                            thresholds=[0.0, 0.2, 0.4, 0.6], beta=0.3, delta=0.1)


def mondrian_ranges(labels: list[Any], seed: int = 0) -> RangeCalibration:
    rng = np.random.default_rng(seed)
    reference = rng.random(len(labels))
    judge = np.clip(reference + rng.normal(0, 0.1, len(labels)), 0, 1)
    return calibrate_ranges(judge, reference, alpha=0.2, categories=labels)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("kwargs", [
    {},
    {"estimator": "rloo"},
    {"estimator": "dr_grpo", "shape": "isotropic", "ridge": 0.5},
    {"estimator": "maxnorm", "options": {"tau_res": 0.01, "baseline": "mean"}},
    {"estimator": "maxnorm", "options": {"tau_res": np.float32(0.02), "clip": False}},
    {"estimator": "grpo", "eps": 0.0, "ddof": 0, "options": {"singleton": "raw"}},
    {"noise": "diagonal", "noise_var": np.full((40, 5), 4e-4)},
    {"alpha": 0.01},  # m = 40 is too few for alpha = 0.01: rho = inf
])
def test_set_calibration_round_trip(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    pair = paired_scorings(40, 5, scale=0.05, seed=3)
    cal = calibrate_sets(pair.a, pair.b, **{"alpha": 0.2, **kwargs})
    back = round_trip(cal, tmp_path / "c.npz")
    if kwargs.get("alpha") == 0.01:
        assert back.rho == math.inf
    # The loaded calibration builds the same sets.
    train = paired_scorings(5, 5, scale=0.05, seed=4).a
    extra = {"noise_var": np.full((5, 5), 4e-4)} if "noise_var" in kwargs else {}
    a = coefficient_sets(train, calibration=cal, **extra)
    b = coefficient_sets(train, calibration=back, **extra)
    assert a.centers.tobytes() == b.centers.tobytes()
    assert a.shapes.tobytes() == b.shapes.tobytes()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scores=st.lists(st.floats(0, 1e6, width=32), min_size=1, max_size=30),
       dtype=st.sampled_from([np.float32, np.float64, np.dtype(">f8")]),
       alpha=st.floats(0.01, 0.99),
       noise_var=st.floats(0, 10), ridge=st.floats(0, 10), eps=st.floats(0, 1),
       ddof=st.sampled_from([0, 1]), shape=st.sampled_from(["joint", "isotropic"]),
       estimator=st.sampled_from(["grpo", "dr_grpo", "rloo", "batch_std", "gpg"]))
def test_set_calibration_round_trip_property(tmp_path: Path, scores: list[float], dtype: Any,
                                             alpha: float, noise_var: float, ridge: float,
                                             eps: float, ddof: int, shape: str,
                                             estimator: str) -> None:
    arr = np.array(scores, dtype=dtype)
    cal = SetCalibration(conformal_quantile(arr, alpha), alpha, noise_var, ridge, arr,
                         estimator, shape, "isotropic", eps, ddof,
                         {"singleton": "zero"} if ddof else {})
    round_trip(cal, tmp_path / "p.npz")


@pytest.mark.parametrize("labels", [
    None,
    ["a", "b", "a", "b", "c"] * 8,
    [1, 2, 1, 2, 3] * 8,
    [1, "1", 1, "1", 2] * 8,  # 1 and "1" are different categories
    [0.5, "x", 0.5, "x", 7] * 8,
    [None, "a", None, "a", 0] * 8,  # None is a label like any other
    np.array([3, 1, 3, 1, 2] * 8),
    np.array(["u", "v", "u", "v", "w"] * 8),
])
def test_range_calibration_round_trip(tmp_path: Path, labels: Any) -> None:
    if labels is None:
        ref = np.random.default_rng(0).random(40)
        cal = calibrate_ranges(ref + 0.01, np.clip(ref, 0, 0.99), alpha=0.2)
    else:
        cal = mondrian_ranges(labels)
    back = round_trip(cal, tmp_path / "r.npz")
    assert isinstance(back.radius, (MappingProxyType, LabelMapping))  # read-only, as saved
    if isinstance(labels, list) and "1" in labels:
        assert list(back.radius) == [1, "1", 2]  # 1 and "1" stay two categories


def test_labels_equal_in_python_round_trip(tmp_path: Path) -> None:
    # 1, True and 1.0 are three categories (advcal's label rule); a dict would merge them,
    # so the radius is a LabelMapping, and it comes back as one with the same labels.
    cal = mondrian_ranges([1, True, 1.0, "1", 2] * 8)
    assert isinstance(cal.radius, LabelMapping)
    back = round_trip(cal, tmp_path / "r.npz")
    assert isinstance(back.radius, LabelMapping)
    assert [(type(k), k) for k in back.radius] == [(int, 1), (bool, True), (float, 1.0),
                                                   (str, "1"), (int, 2)]
    assert [type(c) for c in back.categories[:5]] == [int, bool, float, str, int]
    for label in (1, True, 1.0, "1", 2):
        chosen = np.array([type(c) is type(label) and c == label
                           for c in back.categories.tolist()])
        assert back.radius[label] == conformal_quantile(back.scores[chosen], back.alpha)


@pytest.mark.parametrize("method", ["absolute", "normalized", "cqr"])
def test_range_methods_round_trip(tmp_path: Path, method: str) -> None:
    rng = np.random.default_rng(5)
    y = rng.random(60)
    s = np.clip(y + rng.normal(0, 0.1, 60), 0, 1)
    kwargs: dict[str, Any] = {"sigma": rng.uniform(0.05, 0.2, 60)} if method == "normalized" \
        else {}
    if method == "cqr":
        kwargs = {"lower": s - 0.05, "upper": s + 0.05}
        s = None  # type: ignore[assignment]
    cal = calibrate_ranges(s, y, alpha=0.1, method=method, bounds=(-1.0, 2.0), **kwargs)
    back = round_trip(cal, tmp_path / "r.npz")
    lo, hi = cal.ranges(None if method == "cqr" else np.array([0.5]),
                        **({"lower": np.array([0.4]), "upper": np.array([0.6])}
                           if method == "cqr" else
                           {"sigma": np.array([0.1])} if method == "normalized" else {}))
    lo2, hi2 = back.ranges(None if method == "cqr" else np.array([0.5]),
                           **({"lower": np.array([0.4]), "upper": np.array([0.6])}
                              if method == "cqr" else
                              {"sigma": np.array([0.1])} if method == "normalized" else {}))
    assert (lo, hi) == (lo2, hi2)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(labels=st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=2), st.booleans(),
                                 st.sampled_from(["1", "0", "", 1.0, 0.0, -2.5])),
                       min_size=1, max_size=25),
       seed=st.integers(0, 2**16))
def test_range_categories_round_trip_property(tmp_path: Path, labels: list[Any],
                                              seed: int) -> None:
    cal = mondrian_ranges(labels, seed)
    back = round_trip(cal, tmp_path / "q.npz")
    # Every label keeps its type: 1, True, 1.0 and "1" stay four categories.
    assert [type(k) for k in back.radius] == [type(k) for k in cal.radius]


def test_threshold_selection_round_trip(tmp_path: Path, selection: ThresholdSelection) -> None:
    back = round_trip(selection, tmp_path / "t.npz")
    assert back.tau_sel == selection.tau_sel
    none = selection._replace(tau_sel=None, feasible=np.zeros_like(selection.feasible))
    assert round_trip(none, tmp_path / "n.npz").tau_sel is None


def test_np_load_reads_the_arrays(tmp_path: Path, set_cal: SetCalibration) -> None:
    save_calibration(tmp_path / "c.npz", set_cal)
    with np.load(tmp_path / "c.npz", allow_pickle=False) as data:
        assert set(data.files) == {"header.json", "scores"}
        assert data["scores"].tobytes() == set_cal.scores.tobytes()
        header = json.loads(data["header.json"])
    assert header["format"] == "advcal.calibration"
    assert header["version"] == FORMAT_VERSION
    assert header["kind"] == "SetCalibration"
    assert header["fields"]["estimator"] == "grpo"


def test_loaded_calibration_drives_setgrpo(tmp_path: Path, set_cal: SetCalibration,
                                           selection: ThresholdSelection) -> None:
    save_calibration(tmp_path / "c.npz", set_cal)
    save_calibration(tmp_path / "t.npz", selection)
    batch = paired_scorings(8, 6, scale=0.03, seed=9).a
    gram = gram_matrices(8, 6, seed=10).gram
    a = setgrpo(batch, gram=gram, calibration=set_cal, tau=selection)
    b = setgrpo(batch, gram=gram, calibration=load_calibration(tmp_path / "c.npz"),
                tau=load_calibration(tmp_path / "t.npz"))
    assert a.coefficients.tobytes() == b.coefficients.tobytes()


# --------------------------------------------------------------------------- tampered files


def _set_field(name: str, value: Any) -> Any:
    def edit(h: dict[str, Any]) -> None:
        h["fields"][name] = value
    return edit


@pytest.mark.parametrize(("edit", "field"), [
    (_set_field("rho", {"type": "float", "value": -1.0}), "rho"),
    (_set_field("rho", {"type": "float", "value": 123.0}), "rho"),  # not the quantile
    (_set_field("rho", {"type": "float", "value": "nan"}), "rho"),
    (_set_field("alpha", {"type": "float", "value": 1.5}), "alpha"),
    (_set_field("noise_var", {"type": "float", "value": -0.1}), "noise_var"),
    (_set_field("ridge", {"type": "str", "value": "1"}), "ridge"),
    (_set_field("estimator", "nope"), "estimator"),
    (_set_field("estimator", "passk"), "estimator"),
    (_set_field("shape", "round"), "shape"),
    (_set_field("ddof", {"type": "int", "value": 2}), "ddof"),
    (_set_field("options", {"bogus": {"type": "int", "value": 1}}), "options"),
    (_set_field("options", [1]), "options"),
    (_set_field("eps", {"type": "pickle", "value": "x"}), "eps"),
    (lambda h: h["fields"].pop("noise"), "noise"),
    (lambda h: h["arrays"]["scores"].update(shape=[3]), "scores"),
    (lambda h: h["arrays"]["scores"].update(dtype="|O"), "scores"),
])
def test_tampered_set_header(tmp_path: Path, set_cal: SetCalibration, edit: Any,
                             field: str) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    rewrite(path, header=edit)
    with pytest.raises(ValueError, match=f"`{field}"):
        load_calibration(path)


@pytest.mark.parametrize(("member", "field"), [
    (-np.ones(300), "scores"),  # negative distances
    (np.full(300, np.nan), "scores"),
    (np.ones(300, dtype=np.int64), "scores"),  # dtype differs from the declaration
    (np.ones(299), "scores"),  # shape differs
])
def test_tampered_set_member(tmp_path: Path, set_cal: SetCalibration, member: np.ndarray,
                             field: str) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    rewrite(path, members={"scores.npy": npy(member)})
    with pytest.raises(ValueError, match=f"`{field}`"):
        load_calibration(path)


def test_pickled_member_refused(tmp_path: Path, set_cal: SetCalibration) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    evil = np.array([{"a": 1}] * 300, dtype=object)
    rewrite(path, header=lambda h: h["arrays"]["scores"].update(dtype="|O"),
            members={"scores.npy": npy(evil, allow_pickle=True)})
    with pytest.raises(ValueError, match="scores"):
        load_calibration(path)
    # Declared as float64 but holding a pickle.
    save_calibration(path, set_cal)
    rewrite(path, members={"scores.npy": npy(evil, allow_pickle=True)})
    with pytest.raises(ValueError, match="pickle"):
        load_calibration(path)


def test_undeclared_member_refused(tmp_path: Path, set_cal: SetCalibration) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    rewrite(path, members={"payload.pkl": b"\x80\x04N."})
    with pytest.raises(ValueError, match="unexpected member 'payload.pkl'"):
        load_calibration(path)


def test_missing_member(tmp_path: Path, set_cal: SetCalibration) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    rewrite(path, drop=("scores.npy",))
    with pytest.raises(ValueError, match="`scores` is missing"):
        load_calibration(path)


def test_oversized_member_refused_before_reading(tmp_path: Path,
                                                 set_cal: SetCalibration) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    big = npy(np.zeros(300)) + b"\0" * (1 << 20)
    rewrite(path, members={"scores.npy": big})
    with pytest.raises(ValueError, match="larger than its declared"):
        load_calibration(path)


def test_newer_version_refused(tmp_path: Path, set_cal: SetCalibration) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    rewrite(path, header=lambda h: h.update(version=FORMAT_VERSION + 1))
    with pytest.raises(ValueError, match=f"version {FORMAT_VERSION + 1}, newer than this "
                                         f"advcal reads \\(up to version {FORMAT_VERSION}\\); "
                                         "upgrade advcal"):
        load_calibration(path)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda h: h.update(format="something.else"), "not an advcal calibration"),
    (lambda h: h.update(version="1"), "`version`"),
    (lambda h: h.update(kind="Pickle"), "`kind`"),
    (lambda h: h.update(fields=[]), "`fields`"),
])
def test_bad_header(tmp_path: Path, set_cal: SetCalibration, edit: Any, message: str) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    rewrite(path, header=edit)
    with pytest.raises(ValueError, match=message):
        load_calibration(path)


def test_not_a_calibration_file(tmp_path: Path, set_cal: SetCalibration) -> None:
    text = tmp_path / "c.npz"
    text.write_text("rho = 1\n")
    with pytest.raises(ValueError, match="not an .npz/zip archive"):
        load_calibration(text)
    plain = tmp_path / "plain.npz"
    np.savez(plain, scores=set_cal.scores)
    with pytest.raises(ValueError, match="no header.json member"):
        load_calibration(plain)
    path = tmp_path / "nan.npz"
    save_calibration(path, set_cal)
    with zipfile.ZipFile(path) as zf:
        scores = zf.read("scores.npy")
        header = zf.read("header.json").decode().replace('"value": 0.1', '"value": NaN')
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("header.json", header)
        zf.writestr("scores.npy", scores)
    with pytest.raises(ValueError, match="NaN, which is not JSON"):
        load_calibration(path)
    with pytest.raises(FileNotFoundError):
        load_calibration(tmp_path / "missing.npz")


def test_kind_mismatch(tmp_path: Path, set_cal: SetCalibration) -> None:
    save_calibration(tmp_path / "c.npz", set_cal)
    with pytest.raises(TypeError, match="holds a SetCalibration, not a RangeCalibration"):
        load_calibration(tmp_path / "c.npz", kind=RangeCalibration)


@pytest.mark.parametrize(("edit", "member", "field"), [
    (None, ("radius.npy", np.array([0.1, -0.5, 0.2])), "radius"),
    (None, ("radius.npy", np.array([0.1, 0.2, 0.3])), "radius"),  # not the quantiles
    (None, ("radius.npy", np.array([0.1, 0.2])), "radius"),
    (None, ("category_codes.npy", np.full(40, 7)), "category_codes"),
    (lambda h: h["fields"].update(labels=["a", "a", "c"]), None, "labels"),
    # 1 and True are one key of a dict or mappingproxy radius (a LabelMapping keeps them)
    (lambda h: h["fields"].update(labels=[1, True, "c"], radius_mapping="mappingproxy"), None,
     "labels"),
    (lambda h: h["fields"].update(labels=[[1], "b", "c"]), None, "labels"),
    (lambda h: h["fields"].update(method="median"), None, "method"),
    (lambda h: h["fields"].update(bounds={"type": "tuple", "value": [
        {"type": "float", "value": 1.0}, {"type": "float", "value": 0.0}]}), None, "bounds"),
    (lambda h: h["fields"].update(mondrian=False), None, "mondrian"),
    (lambda h: h["fields"].update(mondrian=1), None, "mondrian"),
])
def test_tampered_ranges(tmp_path: Path, edit: Any, member: Any, field: str) -> None:
    cal = mondrian_ranges(["a", "b", "a", "b", "c"] * 8)
    path = tmp_path / "r.npz"
    save_calibration(path, cal)
    members = None
    if member is not None:
        name, arr = member
        members = {name: npy(arr)}
        decl = name[:-4]

        def edit(h: dict[str, Any]) -> None:  # declare what is written
            h["arrays"][decl] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
    rewrite(path, header=edit, members=members)
    with pytest.raises(ValueError, match=f"`{field}"):
        load_calibration(path)


@pytest.mark.parametrize(("column", "value", "field"), [
    ("risk", lambda s: np.where(s.n_acc > 0, 0.5, np.nan), "risk"),
    ("k_rev", lambda s: s.n_acc + 1, "k_rev"),
    ("ucb", lambda s: s.ucb + 2.0, "ucb"),
    ("tau", lambda s: s.tau[::-1].copy(), "tau"),
    ("recovery", lambda s: -np.ones_like(s.recovery), "recovery"),
    ("feasible", lambda s: np.ones(s.tau.size, dtype=np.int8), "feasible"),
])
def test_tampered_selection(tmp_path: Path, selection: ThresholdSelection, column: str,
                            value: Any, field: str) -> None:
    path = tmp_path / "t.npz"
    save_calibration(path, selection)
    arr = value(selection)

    def declare(h: dict[str, Any]) -> None:
        h["arrays"][column] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
    rewrite(path, header=declare, members={f"{column}.npy": npy(arr)})
    with pytest.raises(ValueError, match=f"`{field}`"):
        load_calibration(path)


def test_tampered_tau_sel(tmp_path: Path, selection: ThresholdSelection) -> None:
    path = tmp_path / "t.npz"
    save_calibration(path, selection)
    rewrite(path, header=_set_field("tau_sel", {"type": "float", "value": 0.33}))
    with pytest.raises(ValueError, match="`tau_sel`"):
        load_calibration(path)


# --------------------------------------------------------------------------- objects by hand


@pytest.mark.parametrize(("changes", "field"), [
    ({"rho": -1.0}, "rho"),
    ({"rho": math.nan}, "rho"),
    ({"alpha": 0.0}, "alpha"),
    ({"noise_var": -1e-3}, "noise_var"),
    ({"ridge": math.inf}, "ridge"),
    ({"scores": np.ones((2, 3))}, "scores"),
    ({"scores": [0.1, 0.2]}, "scores"),
    ({"scores": np.array([], dtype=float)}, "scores"),
    ({"scores": np.array([1, 2])}, "scores"),
    ({"estimator": "nope"}, "estimator"),
    ({"estimator": "opo"}, "estimator"),
    ({"shape": "ball"}, "shape"),
    ({"noise": "pink"}, "noise"),
    ({"eps": -1e-6}, "eps"),
    ({"ddof": 2}, "ddof"),
    ({"ddof": True}, "ddof"),
    ({"options": {"tau": 1}}, "options"),
    ({"options": {"singleton": np.zeros(3)}}, "options"),
    ({"estimator": "maxnorm"}, "tau_res"),
    ({"estimator": "maxnorm", "options": {"tau_res": -1.0}}, "tau_res"),
])
def test_hand_built_set_calibration(set_cal: SetCalibration, changes: dict[str, Any],
                                    field: str) -> None:
    with pytest.raises((ValueError, TypeError), match=field):
        dataclasses.replace(set_cal, **changes)


def test_negative_radius_no_longer_reaches_setgrpo(set_cal: SetCalibration) -> None:
    # The issue's reproducer: this used to be accepted and setgrpo returned NaN.
    with pytest.raises(ValueError, match="`rho` must be >= 0"):
        dataclasses.replace(set_cal, rho=-1.0)


def test_hand_built_range_calibration() -> None:
    cal = mondrian_ranges(["a", "b"] * 10)
    with pytest.raises(ValueError, match=r"`radius\['a'\]`"):
        dataclasses.replace(cal, radius={"a": -0.1, "b": 0.2})
    with pytest.raises(ValueError, match="`radius` has no entry for category 'b'"):
        dataclasses.replace(cal, radius={"a": 0.1})
    with pytest.raises(ValueError, match="`radius` has category 'z'"):
        dataclasses.replace(cal, radius={"a": 0.1, "b": 0.2, "z": 0.3})
    with pytest.raises(ValueError, match="`categories` must have the shape"):
        dataclasses.replace(cal, categories=cal.categories[:3])
    with pytest.raises(ValueError, match="`method`"):
        dataclasses.replace(cal, method="median")
    with pytest.raises(ValueError, match="`bounds`"):
        dataclasses.replace(cal, bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="`scores` must be finite"):
        dataclasses.replace(cal, scores=np.full(20, np.inf))
    plain = calibrate_ranges(np.array([0.2, 0.4]), np.array([0.3, 0.4]), alpha=0.5)
    with pytest.raises(ValueError, match="single key None"):
        dataclasses.replace(plain, radius={"a": 0.1})
    # cqr scores and radii may be negative.
    cqr = calibrate_ranges(None, np.array([0.5, 0.5]), alpha=0.5, method="cqr",
                           lower=np.array([0.4, 0.3]), upper=np.array([0.6, 0.7]))
    assert cqr.radius[None] < 0


def test_hand_built_selection_checked_by_setgrpo(tmp_path: Path, set_cal: SetCalibration,
                                                 selection: ThresholdSelection) -> None:
    batch = paired_scorings(4, 6, scale=0.03, seed=9).a
    gram = gram_matrices(4, 6, seed=10).gram
    bad = selection._replace(n_acc=selection.n_acc[:2])
    with pytest.raises(ValueError, match="`n_acc` must have shape"):
        setgrpo(batch, gram=gram, calibration=set_cal, tau=bad)
    with pytest.raises(ValueError, match="`tau_sel`"):
        setgrpo(batch, gram=gram, calibration=set_cal, tau=selection._replace(tau_sel=0.77))
    with pytest.raises(ValueError, match="`tau_sel`|`feasible`"):
        save_calibration(tmp_path / "t.npz",
                         selection._replace(feasible=~selection.feasible))
    assert not list(tmp_path.iterdir())


def test_save_refuses_unrepresentable(tmp_path: Path, set_cal: SetCalibration) -> None:
    with pytest.raises(TypeError, match="SetCalibration, RangeCalibration or "
                                        "ThresholdSelection"):
        save_calibration(tmp_path / "x.npz", {"rho": 1.0})
    with pytest.raises(ValueError, match="`rho` .* is not the conformal quantile"):
        save_calibration(tmp_path / "x.npz", dataclasses.replace(set_cal, rho=2 * set_cal.rho))
    cal = calibrate_ranges(np.array([0.2, 0.4]), np.array([0.3, 0.4]), alpha=0.5,
                           categories=[(1, 2), (1, 2)])
    with pytest.raises(ValueError, match="`categories`: label"):
        save_calibration(tmp_path / "x.npz", cal)
    assert not list(tmp_path.iterdir())  # nothing half-written is left behind


def test_save_refuses_fields_the_format_does_not_know(tmp_path: Path,
                                                      set_cal: SetCalibration) -> None:
    # A field added to a calibration class must come with a format version, not be dropped.
    @dataclasses.dataclass(frozen=True)
    class Extended(SetCalibration):
        seed: int = 0

    extended = Extended(**{f.name: getattr(set_cal, f.name)
                           for f in dataclasses.fields(SetCalibration)})
    with pytest.raises(ValueError, match="`seed`: calibration format version 1 does not"):
        save_calibration(tmp_path / "x.npz", extended)


def test_exports() -> None:
    assert advcal.save_calibration is save_calibration
    assert advcal.load_calibration is load_calibration
