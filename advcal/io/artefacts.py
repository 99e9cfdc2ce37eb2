"""Calibration artefacts: save and load calibrations in one versioned, pickle-free format.

A calibration (:class:`~advcal.SetCalibration`, :class:`~advcal.RangeCalibration` or
:class:`~advcal.ThresholdSelection`) is computed once, offline, from paired gradings and
then used for a whole training run, often in another process or on another machine.
:func:`save_calibration` writes it to an ``.npz`` archive (a zip file) holding

* ``header.json``: UTF-8 JSON with the format name ``"advcal.calibration"``, the format
  ``version``, the ``kind`` (class name), the scalar ``fields`` and a declaration
  (``dtype``, ``shape``) of every array member;
* one ``<field>.npy`` member per array field, written without pickle.

:func:`load_calibration` reads it back bit for bit and validates every field, the way the
constructors do plus cross-checks between fields (the radius is the conformal quantile of
the stored scores, the risk column is ``k_rev / n_acc``, ...).  A file written by a newer
format version is refused.  Reading is bounded (``max_bytes``, checked before anything is
decompressed; only regular files; at most 64 members) by the one ``.npy``/``.npz`` reader
of :mod:`advcal.io._npy`.  The format and its limits are described in ``docs/calibration.md``.

Each class checks its own invariants on construction (``advcal.sets``, ``advcal.conformal``,
``advcal.risk``); this module encodes and decodes, then runs the same checks.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import numbers
import os
import zipfile
from collections.abc import Mapping
from types import MappingProxyType
from typing import IO, Any

import numpy as np

from advcal._files import atomic_write, open_regular, user_path
from advcal._version import __version__
from advcal.conformal import (
    RangeCalibration,
    check_range_consistency,
    validate_range_calibration,
)
from advcal.io import _npy
from advcal.labels import LabelMapping
from advcal.layouts import label_key
from advcal.risk import ThresholdSelection, validate_threshold_selection
from advcal.sets import SetCalibration, check_set_consistency, validate_set_calibration

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "load_calibration",
    "save_calibration",
]

FORMAT_NAME = "advcal.calibration"
FORMAT_VERSION = 1
HEADER = "header.json"
# load_calibration's default memory budget for a file's contents, checked from the zip
# directory and the headers before anything is decompressed (a zip bomb is never read).
MAX_BYTES = 1 << 30
# Parsing JSON into Python objects takes up to ~30 bytes per byte of text ("[[]]," nests
# lists); header.json is charged at this rate against the budget.
JSON_COST = 64
# A calibration has at most a dozen array members; more is not a calibration file.
MAX_MEMBERS = 64

# The classes a file may hold, by the ``kind`` it records: the codec is the same for all,
# field by field (arrays as members, strings as strings, mappings of values and any other
# value tagged with its type), but for the category labels of a RangeCalibration.
CLASSES: dict[str, type] = {cls.__name__: cls for cls in
                            (SetCalibration, RangeCalibration, ThresholdSelection)}
KINDS = tuple(CLASSES)
_LABEL_FIELDS = ("radius", "categories")


# --------------------------------------------------------------------------- checks


def _validate(obj: Any) -> str:
    """Validate any calibration object; return its kind."""

    if isinstance(obj, SetCalibration):
        validate_set_calibration(obj)
        return "SetCalibration"
    if isinstance(obj, RangeCalibration):
        validate_range_calibration(obj)
        return "RangeCalibration"
    if isinstance(obj, ThresholdSelection):
        validate_threshold_selection(obj)
        return "ThresholdSelection"
    raise TypeError("`obj` must be a SetCalibration, RangeCalibration or ThresholdSelection; "
                    f"got {type(obj).__name__}.")


def _check_consistent(kind: str, obj: Any) -> None:
    """The cross-field checks each calibration routine guarantees (a tampered file fails)."""
    if kind == "SetCalibration":
        check_set_consistency(obj)
    elif kind == "RangeCalibration":
        check_range_consistency(obj)


# --------------------------------------------------------------------------- encoding


def _encode_float(value: float) -> float | str:
    """JSON numbers are exact for finite floats (shortest repr); infinities are strings."""
    v = float(value)
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _decode_float(value: Any, name: str) -> float:
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` must be a number in the file; got {_short(value)}.")
    try:
        return float(value)
    except OverflowError:  # JSON integers have no range; floats do
        raise ValueError(f"`{name}` is an integer too large for a float in the file.") from None


def _encode_value(value: Any, name: str) -> dict[str, Any]:
    """A tagged JSON value that decodes to the same Python type and value."""
    if value is None:
        return {"type": "none"}
    if isinstance(value, np.generic):
        if value.dtype.kind not in "biuf":
            raise ValueError(f"`{name}`: numpy scalars of dtype {value.dtype} cannot be saved.")
        return {"type": "numpy", "dtype": value.dtype.str,
                "value": _encode_value(value.item(), name)}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf" or value.ndim != 1:
            raise ValueError(f"`{name}`: only 1-D numeric arrays can be saved.")
        return {"type": "ndarray", "dtype": value.dtype.str,
                "value": [_encode_value(v, name) for v in value.tolist()]}
    if type(value) is bool:
        return {"type": "bool", "value": value}
    if type(value) is int:
        return {"type": "int", "value": value}
    if type(value) is float:
        return {"type": "float", "value": _encode_float(value)}
    if type(value) is str:
        return {"type": "str", "value": value}
    if type(value) in (tuple, list):
        return {"type": type(value).__name__,
                "value": [_encode_value(v, name) for v in value]}
    raise ValueError(f"`{name}` of type {type(value).__name__} cannot be saved (supported: "
                     "None, bool, int, float, str, numpy scalars, tuples, lists, 1-D arrays).")


def _decode_value(tagged: Any, name: str) -> Any:
    if not isinstance(tagged, dict) or "type" not in tagged:
        raise ValueError(f"`{name}` is not a tagged value in the file.")
    kind = tagged["type"]
    value = tagged.get("value")
    if kind == "none":
        return None
    if kind == "bool" and type(value) is bool:
        return value
    if kind == "int" and type(value) is int:
        return value
    if kind == "float":
        return _decode_float(value, name)
    if kind == "str" and type(value) is str:
        return value
    if kind in ("tuple", "list") and isinstance(value, list):
        items = [_decode_value(v, name) for v in value]
        return tuple(items) if kind == "tuple" else items
    if kind in ("numpy", "ndarray"):
        dtype = _safe_dtype(tagged.get("dtype"), name)
        if kind == "numpy":
            item = _decode_value(value, name)
        elif isinstance(value, list):
            item = [_decode_value(v, name) for v in value]
        else:
            raise ValueError(f"`{name}` must hold a list in the file.")
        if not all(type(v) in (bool, int, float) for v in (item if kind == "ndarray"
                                                           else [item])):
            raise ValueError(f"`{name}` must hold numbers for dtype {dtype} in the file.")
        try:
            return dtype.type(item) if kind == "numpy" else np.array(item, dtype=dtype)
        except (OverflowError, ValueError, TypeError):  # e.g. 300 for int8
            raise ValueError(f"`{name}` holds a value out of range for dtype {dtype} in the "
                             "file.") from None
    raise ValueError(f"`{name}` has an invalid tagged value {_short(tagged)} in the file.")


def _safe_dtype(text: Any, name: str) -> np.dtype:
    try:
        dtype = np.dtype(text) if isinstance(text, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biuf" or dtype.hasobject:
        raise ValueError(f"`{name}` declares an unsupported dtype {text!r} in the file.")
    return dtype


def _label_json(label: Any) -> Any:
    # JSON tells 1, 1.0, "1", true and null apart, so each label comes back with its type.
    if label is None or type(label) in (str, int, bool) \
            or (type(label) is float and math.isfinite(label)):
        return label
    raise ValueError(f"`categories`: label {label!r} of type {type(label).__name__} cannot be "
                     "saved (supported: None, str, int, bool, finite float).")


def _field_names(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls._fields)  # type: ignore[attr-defined]  # a NamedTuple


def _has_default(cls: type, name: str) -> bool:
    if dataclasses.is_dataclass(cls):
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        return field.default is not dataclasses.MISSING \
            or field.default_factory is not dataclasses.MISSING
    return name in cls._field_defaults  # type: ignore[attr-defined]


def _encode(obj: Any, kind: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header fields, array members) of a validated object, field by field."""
    fields: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    names = _field_names(CLASSES[kind])
    # A field added in a subclass would be dropped on load: it needs a format version.
    unknown = [name for name in _field_names(type(obj)) if name not in names]
    if unknown:
        raise ValueError(f"`{unknown[0]}`: calibration format version {FORMAT_VERSION} "
                         f"does not store this field of {kind}.")
    for name in names:
        if kind == "RangeCalibration" and name in _LABEL_FIELDS:
            continue
        value = getattr(obj, name)
        if isinstance(value, np.ndarray):
            arrays[name] = value
        elif isinstance(value, str):
            fields[name] = value
        elif isinstance(value, Mapping):
            if not all(isinstance(k, str) for k in value):
                raise ValueError(f"`{name}` must have string keys to be saved.")
            fields[name] = {k: _encode_value(v, f"{name}[{k!r}]") for k, v in value.items()}
        else:
            fields[name] = _encode_value(value, name)
    if kind == "RangeCalibration":
        _encode_labels(obj, fields, arrays)
    for name, arr in arrays.items():
        if arr.dtype.hasobject or arr.dtype.kind not in "biuf":
            raise ValueError(f"`{name}` of dtype {arr.dtype} cannot be saved.")
    return fields, arrays


def _encode_labels(obj: RangeCalibration, fields: dict[str, Any],
                   arrays: dict[str, np.ndarray]) -> None:
    """A range calibration's radius per category: the labels in JSON (which keeps their
    types apart), the radii and each score's category as codes into the labels."""
    keys = list(obj.radius)
    fields["mondrian"] = obj.categories is not None
    fields["labels"] = [] if obj.categories is None else [_label_json(k) for k in keys]
    fields["radius_mapping"] = type(obj.radius).__name__
    if len({json.dumps(k) for k in fields["labels"]}) != len(fields["labels"]):
        raise ValueError("`radius` has labels that are equal in JSON (e.g. 1 and True).")
    arrays["radius"] = np.array([float(obj.radius[k]) for k in keys], dtype=np.float64)
    if obj.categories is not None:
        index = {label_key(k): i for i, k in enumerate(keys)}
        arrays["category_codes"] = np.array(
            [index[label_key(lab)] for lab in obj.categories.tolist()], dtype=np.int64)


def _field(fields: Mapping[str, Any], name: str) -> Any:
    if name not in fields:
        raise ValueError(f"`{name}` is missing from the file's header.")
    return fields[name]


def _decode_field(stored: Any, name: str) -> Any:
    """A header field as :func:`_encode` wrote it: a string, a tagged value, or a mapping of
    tagged values (the class's own validation then checks its type and range)."""
    if isinstance(stored, str):
        return stored
    if isinstance(stored, dict) and isinstance(stored.get("type"), str):
        return _decode_value(stored, name)
    if isinstance(stored, dict):
        return {k: _decode_value(v, f"{name}[{k!r}]") for k, v in stored.items()}
    raise ValueError(f"`{name}` is malformed in the file: {_short(stored)}.")


def _decode(kind: str, fields: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    cls = CLASSES[kind]
    kwargs: dict[str, Any] = {}
    for name in _field_names(cls):
        if kind == "RangeCalibration" and name in _LABEL_FIELDS:
            continue
        if name in arrays:
            kwargs[name] = arrays[name]
        elif name in fields:
            kwargs[name] = _decode_field(fields[name], name)
        elif not _has_default(cls, name):
            raise ValueError(f"`{name}` is missing from the file.")
    if kind == "RangeCalibration":
        if not isinstance(kwargs.get("scores"), np.ndarray):
            raise ValueError("`scores` is missing from the file (no member scores.npy).")
        kwargs.update(_decode_labels(fields, arrays, kwargs["scores"]))
        kwargs["scores"].flags.writeable = False
    return cls(**kwargs)


def _decode_labels(fields: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                   scores: np.ndarray) -> dict[str, Any]:
    """``radius`` and ``categories`` of a range calibration from :func:`_encode_labels`."""
    if "radius" not in arrays:
        raise ValueError("`radius` is missing from the file (no member radius.npy).")
    radius_values = arrays["radius"]
    mondrian = _field(fields, "mondrian")
    labels = _field(fields, "labels")
    if type(mondrian) is not bool or not isinstance(labels, list):
        raise ValueError("`mondrian` / `labels` are malformed in the file.")
    if radius_values.dtype != np.float64 or radius_values.ndim != 1:
        raise ValueError("`radius` must be a 1-D float64 member in the file.")
    if not mondrian and (labels or "category_codes" in arrays):
        raise ValueError("`mondrian` is false but the file has category labels.")
    keys: list[Any] = list(labels) if mondrian else [None]
    for label in keys:
        if isinstance(label, (list, dict)):
            raise ValueError(f"`labels` holds {_short(label)}, which is not a label.")
    if len({json.dumps(k) for k in keys}) != len(keys):
        raise ValueError("`labels` has duplicate labels in the file.")
    if radius_values.size != len(keys):
        raise ValueError(f"`radius` must have one value per category ({len(keys)}); got "
                         f"{radius_values.size}.")
    mapping = _field(fields, "radius_mapping")
    pairs = list(zip(keys, radius_values.tolist(), strict=True))
    radius: Mapping[Any, float]
    if mapping == "LabelMapping":  # keeps 1, True and 1.0 apart
        radius = LabelMapping(pairs)
    else:
        radius = dict(pairs)
        if len(radius) != len(keys):  # 1 and True collide as dict keys
            raise ValueError("`labels` has labels that are equal in Python (e.g. 1 and "
                             "True), which only a LabelMapping radius keeps apart.")
        if mapping == "mappingproxy":
            radius = MappingProxyType(radius)
    categories = None
    if mondrian:
        if "category_codes" not in arrays:
            raise ValueError("`category_codes` is missing from the file.")
        codes = arrays["category_codes"]
        if codes.dtype.kind not in "iu" or codes.shape != scores.shape:
            raise ValueError(f"`category_codes` must be integers of shape {scores.shape}.")
        if codes.size and (codes.min() < 0 or codes.max() >= len(keys)):
            raise ValueError("`category_codes` must index `labels`.")
        categories = np.empty(codes.size, dtype=object)
        categories[:] = [keys[c] for c in codes.tolist()]
        categories.flags.writeable = False
    return {"radius": radius, "categories": categories}


# --------------------------------------------------------------------------- files


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(arr), allow_pickle=False)
    return buf.getvalue()


def save_calibration(path: str | os.PathLike[str], obj: Any) -> None:
    """Write a calibration to ``path`` in the advcal calibration format (an ``.npz``).

    Parameters
    ----------
    path : str or path-like
        Destination file (conventionally ``*.npz``; no extension is added).  It is
        written to a temporary file in the same folder and then renamed, so a reader
        never sees half a file; its mode follows the umask (``0o666 & ~umask``).  Only a
        regular file is replaced: a symlink, FIFO, device node or directory at ``path``
        is refused and left as it is.
    obj : SetCalibration, RangeCalibration or ThresholdSelection
        The calibration.  It is validated first, as :func:`load_calibration` would
        validate the file.

    Raises
    ------
    TypeError, ValueError
        ``path`` is not a str or path-like object (bytes included); ``obj`` is of another
        type, fails validation, or holds a value the format cannot represent exactly (an
        option or category label of an unsupported type).
    OSError
        ``path`` is not a regular file's path, or cannot be written; the message names it.

    Examples
    --------
    >>> import tempfile, os
    >>> from advcal import calibrate_sets, load_calibration, save_calibration
    >>> from advcal.simulate import paired_scorings
    >>> pair = paired_scorings(200, 8, scale=0.02, seed=0)
    >>> cal = calibrate_sets(pair.a, pair.b, alpha=0.1)
    >>> path = os.path.join(tempfile.mkdtemp(), "sets.npz")
    >>> save_calibration(path, cal)
    >>> back = load_calibration(path)
    >>> back.rho == cal.rho, back.scores.tobytes() == cal.scores.tobytes()
    (True, True)
    """
    target = user_path(path, "path")
    kind = _validate(obj)
    _check_consistent(kind, obj)
    fields, arrays = _encode(obj, kind)

    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "kind": kind,
        "writer": f"advcal {__version__}",
        "fields": fields,
        "arrays": {name: {"dtype": arr.dtype.str, "shape": list(arr.shape)}
                   for name, arr in arrays.items()},
    }
    text = json.dumps(header, allow_nan=False, ensure_ascii=False, indent=1)

    def write(f: IO[bytes]) -> None:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr(HEADER, text.encode("utf-8"))
            for name, arr in arrays.items():
                zf.writestr(f"{name}.npy", _npy_bytes(arr))

    atomic_write(target, write, "calibration file")


def _read_header(zf: zipfile.ZipFile, where: str, max_bytes: int) -> dict[str, Any]:
    try:
        info = zf.getinfo(HEADER)
    except KeyError:
        raise ValueError(f"{where}: not an advcal calibration file (no {HEADER} member; "
                         "files are written by advcal.save_calibration).") from None
    if info.file_size * JSON_COST > max_bytes:
        raise ValueError(f"{where}: {HEADER} is {info.file_size:,} bytes; parsing it may take "
                         f"{JSON_COST} bytes of memory per byte, over max_bytes = "
                         f"{max_bytes:,} (pass a larger max_bytes to load it).")
    try:
        _npy.check_member(info, HEADER)
        with _npy.zip_errors(HEADER):
            raw = zf.read(info)
    except _npy.NpyError as exc:
        raise ValueError(f"{where}: {exc}.") from None
    try:
        header = json.loads(raw.decode("utf-8"),
                            parse_constant=lambda c: _bad_constant(c, where))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{where}: {HEADER} is not valid UTF-8 JSON ({exc}).") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        if str(exc).startswith(where):
            raise
        raise ValueError(f"{where}: {HEADER} is not valid JSON ({exc}).") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: {HEADER} must be a JSON object.")
    if header.get("format") != FORMAT_NAME:
        raise ValueError(f"{where}: `format` is {_short(header.get('format'))}, not "
                         f"{FORMAT_NAME!r}: not an advcal calibration file.")
    version = header.get("version")
    if type(version) is not int or version < 1:
        raise ValueError(f"{where}: `version` must be a positive integer; got "
                         f"{_short(version)}.")
    if version > FORMAT_VERSION:
        raise ValueError(f"{where}: written in calibration format version {version}, newer "
                         f"than this advcal reads (up to version {FORMAT_VERSION}); upgrade "
                         "advcal to load it.")
    if header.get("kind") not in KINDS:
        raise ValueError(f"{where}: `kind` must be one of {', '.join(KINDS)}; got "
                         f"{_short(header.get('kind'))}.")
    for key in ("fields", "arrays"):
        if not isinstance(header.get(key), dict):
            raise ValueError(f"{where}: `{key}` must be a JSON object in {HEADER}.")
    return header


def _short(value: Any) -> str:
    # repr of a value from the file, cut short: an error message stays one short line.
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad_constant(constant: str, where: str) -> Any:
    raise ValueError(f"{where}: {HEADER} holds {constant}, which is not JSON "
                     "(infinities are written as strings).")


def _declared(name: str, spec: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape ``header.json`` declares for the member ``name``."""
    if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list) or not all(
            type(s) is int and s >= 0 for s in spec["shape"]) \
            or len(spec["shape"]) > _npy.MAX_NDIM:
        raise ValueError(f"`{name}` has a malformed declaration in {HEADER}.")
    return _safe_dtype(spec.get("dtype"), name), tuple(spec["shape"])


def _read_member(zf: zipfile.ZipFile, name: str, dtype: np.dtype, shape: tuple[int, ...],
                 max_bytes: int) -> np.ndarray:
    try:
        info = zf.getinfo(f"{name}.npy")
    except KeyError:
        raise ValueError(f"`{name}` is missing (no member {name}.npy).") from None
    nbytes = dtype.itemsize * math.prod(shape)
    if info.file_size > nbytes + _npy.MAX_HEADER_BYTES + 16:
        raise ValueError(f"`{name}` is larger than its declared dtype and shape allow; "
                         "refused before reading.")

    def agrees(header: _npy.NpyHeader) -> None:
        if header.dtype != dtype or header.shape != shape:
            raise _npy.NpyError(f"`{name}` has dtype {header.dtype} and shape "
                                f"{header.shape}; {HEADER} declares {dtype} and {shape}")

    try:
        return _npy.read_member(zf, info, f"`{name}`", max_bytes, exact=True,
                                header_check=agrees)
    except _npy.NpyError as exc:
        raise ValueError(f"{exc}.") from None


def load_calibration(path: str | os.PathLike[str], *, kind: type | None = None,
                     max_bytes: int = MAX_BYTES) -> Any:
    """Read a calibration written by :func:`save_calibration`, validating every field.

    Parameters
    ----------
    path : str or path-like
        The file; only a regular file (or a symlink to one) is read.
    kind : type, optional
        The class expected (``SetCalibration``, ``RangeCalibration`` or
        ``ThresholdSelection``); a file holding another kind is a ``TypeError``.
    max_bytes : int, default 2**30
        The memory the file's contents may take once read: the bytes of its arrays (their
        declared dtype and shape, an empty dimension counted as 1) plus ``JSON_COST`` (64)
        bytes per byte of ``header.json``, what parsing JSON may take.  Checked from the
        zip directory and the headers before anything is decompressed; the peak memory of
        a load is then about the arrays it returns, and never more than ``max_bytes``
        plus a 1 MiB read buffer.

    Returns
    -------
    SetCalibration, RangeCalibration or ThresholdSelection
        Equal to the saved object field by field, bit for bit (array dtypes, category
        labels and their types included).

    Raises
    ------
    ValueError
        The file is not an advcal calibration (not a zip/npz archive, no header, another
        format), is corrupt (a CRC mismatch, a broken or truncated member), was written by
        a newer format version, holds pickled, undeclared, encrypted or bzip2/LZMA
        members or more than 64 of them, is over ``max_bytes``, or a field fails
        validation; the message names the file and the field.
    TypeError
        ``path`` is not a str or path-like object (bytes paths included), ``max_bytes`` is
        not an integer, or the file holds another ``kind``.
    OSError
        The file cannot be opened or is not a regular file (a FIFO, a device, a
        directory); the message names the file.

    Examples
    --------
    >>> import tempfile, os
    >>> import numpy as np
    >>> from advcal import calibrate_ranges, load_calibration, save_calibration
    >>> cal = calibrate_ranges(np.array([0.2, 0.5, 0.9]), np.array([0.3, 0.5, 0.7]),
    ...                        alpha=0.5, categories=["a", 1, 1])
    >>> path = os.path.join(tempfile.mkdtemp(), "ranges.npz")
    >>> save_calibration(path, cal)
    >>> dict(load_calibration(path).radius)
    {'a': 0.1, 1: 0.2}
    """
    source = user_path(path, "path")
    if isinstance(max_bytes, (bool, np.bool_)) or not isinstance(max_bytes, numbers.Integral):
        raise TypeError(f"`max_bytes` must be an integer; got {type(max_bytes).__name__}.")
    if max_bytes <= 0:
        raise ValueError(f"`max_bytes` must be positive; got {max_bytes}.")
    max_bytes = int(max_bytes)
    if kind is not None and kind not in (SetCalibration, RangeCalibration, ThresholdSelection):
        raise TypeError("`kind` must be SetCalibration, RangeCalibration, ThresholdSelection "
                        f"or None; got {_short(kind)}.")
    where = str(source)
    f, size = open_regular(source, "calibration file")
    with f:
        try:
            zf = _npy.open_zip(f, size, MAX_MEMBERS)
        except _npy.NpyError as exc:
            raise ValueError(f"{where}: not an advcal calibration file ({exc}).") from None
        with zf:
            arrays, header = _read_archive(zf, where, max_bytes)
    found = header["kind"]
    try:
        obj = _decode(found, header["fields"], arrays)
        _validate(obj)  # ThresholdSelection has no constructor checks of its own
        _check_consistent(found, obj)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    if kind is not None and type(obj) is not kind:
        raise TypeError(f"{where}: holds a {found}, not a {kind.__name__}.")
    return obj


def _read_archive(zf: zipfile.ZipFile, where: str, max_bytes: int
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The array members and the parsed header of an open calibration archive."""
    header = _read_header(zf, where, max_bytes)
    declared = header["arrays"]
    expected_members = {HEADER} | {f"{name}.npy" for name in declared}
    for member in zf.namelist():
        if member not in expected_members:
            raise ValueError(f"{where}: unexpected member {_short(member)} (not declared in "
                             f"{HEADER}).")
    try:
        specs = {name: _declared(name, spec) for name, spec in declared.items()}
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    budget = zf.getinfo(HEADER).file_size * JSON_COST
    budget += sum(_npy.footprint(shape, dtype.itemsize) for dtype, shape in specs.values())
    if budget > max_bytes:
        raise ValueError(f"{where}: its arrays and header take {budget:,} bytes once read, "
                         f"over max_bytes = {max_bytes:,}; refused before reading (pass a "
                         "larger max_bytes to load it).")
    try:
        arrays = {name: _read_member(zf, name, dtype, shape, max_bytes)
                  for name, (dtype, shape) in specs.items()}
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return arrays, header
