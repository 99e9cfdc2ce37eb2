"""Assertions and damaged files shared by the test modules' bad-input (fuzz) tests."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import advcal

ADVCAL_DIR = os.path.dirname(advcal.__file__)


def assert_raised_by_advcal(exc: BaseException) -> None:
    """``exc`` must be a ValueError/TypeError raised by advcal's own code, not by numpy,
    scipy or numba underneath it."""
    assert isinstance(exc, (ValueError, TypeError)), repr(exc)
    tb = exc.__traceback__
    assert tb is not None
    while tb.tb_next is not None:
        tb = tb.tb_next
    raiser = tb.tb_frame.f_code.co_filename
    assert raiser.startswith(ADVCAL_DIR), f"{exc!r} raised in {raiser}"


def own_error_or_result(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; a failure must be advcal's own ValueError/TypeError (then None)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - assert_raised_by_advcal inspects it
        assert_raised_by_advcal(exc)
        return None


def set_zip_flags(path: Path, *, flag: int = 0, method: int | None = None) -> None:
    """Set general-purpose flag bits (0x01: encrypted) and/or the compression method in every
    local and central directory header of the zip file at ``path``."""
    raw = bytearray(path.read_bytes())
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = raw.find(signature)
        while at >= 0:
            raw[at + flag_at] |= flag
            if method is not None:
                raw[at + flag_at + 2:at + flag_at + 4] = struct.pack("<H", method)
            at = raw.find(signature, at + 4)
    path.write_bytes(bytes(raw))
