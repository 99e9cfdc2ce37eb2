"""The CLI's ground floor: exit codes, which exceptions are the user's bad input, and how
an error becomes the one printable line on stderr.

A command that finds a bad file or option raises :class:`CommandError` with its line;
anything a reader or decoder raises for corrupt content is recognised by
:func:`is_bad_input`.  Both end in ``PROG: error: LINE`` and exit code 2 (``advcal.cli.main``).
"""

from __future__ import annotations

import csv
import lzma
import os
import sys
import tokenize
import zipfile
import zlib

# Exit codes (docs/cli.md): a bad file or option; Ctrl-C; stdout closed by its reader
# (128 + SIGPIPE, what a shell reports for a tool that SIGPIPE ended).
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141


class CommandError(Exception):
    """A problem with the user's file or options, in the words of the command that found
    it: printed as one line after ``PROG: error:``, exit code 2."""


# What a bad file or option raises: advcal's own ValueError (the readers' LogError is
# one), TypeError and OSError; and from the decoders under the readers, a number too big
# for a float, a truncated stream, a corrupt zip, deflate, xz or CSV stream, an .npy header
# that does not parse, a file too big for memory.  Anything else is a bug: it keeps its
# traceback.
_BAD_INPUT: tuple[type[BaseException], ...] = (
    ValueError, TypeError, OSError, OverflowError, EOFError, MemoryError,
    zipfile.BadZipFile, zlib.error, lzma.LZMAError, csv.Error, tokenize.TokenError,
    SyntaxError,
)
# Control characters (a hostile file or column name) are shown escaped, not sent to the
# terminal; tabs are kept.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127) if c != 9}

# Stdlib decoders whose RuntimeErrors are about the bytes they decode: zipfile's for an
# encrypted member or an unknown compression method (NotImplementedError), json's
# RecursionError for nesting too deep.  A RuntimeError from anywhere else is a bug.
_DECODERS = ("zipfile", "json")


def bad_input_types() -> tuple[type[BaseException], ...]:
    """:data:`_BAD_INPUT`, every pyarrow error (pyarrow only reads logs) and
    ``RuntimeError``, of which :func:`is_bad_input` keeps only the decoders'."""
    arrow = sys.modules.get("pyarrow.lib")
    extra = (arrow.ArrowException,) if arrow is not None else ()
    return (*_BAD_INPUT, *extra, RuntimeError)


def is_bad_input(exc: BaseException) -> bool:
    """Whether ``exc`` says the user's file or option is bad (one line, exit code 2)
    rather than that advcal has a bug (a traceback)."""
    if isinstance(exc, bad_input_types()[:-1]):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return module.split(".")[0] in _DECODERS


def printable(text: str) -> str:
    """``text`` with a file name's undecodable bytes (surrogate escapes) shown as ``\\xNN``
    and any other unencodable character backslash-escaped: printing it cannot fail."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that escapes no byte (from a JSON string)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def one_line(text: str) -> str:
    """``text`` as one printable line: its lines joined by ``; ``, control characters
    escaped."""
    lines = (line.strip() for line in text.splitlines())
    return printable("; ".join(line for line in lines if line)).translate(_CONTROL)


def describe(exc: BaseException) -> str:
    """The one-line message of a bad-input exception (:func:`is_bad_input`)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
        name = exc.filename
        if isinstance(name, (str, bytes)):
            name = os.fsdecode(name)
            if name not in text:
                text = f"{name}: {text}"
    elif isinstance(exc, MemoryError):
        text = f"out of memory ({exc})" if str(exc) else "out of memory"
    else:
        text = str(exc) or type(exc).__name__
    return one_line(text)


def file_error(path: str, exc: BaseException) -> str:
    """The one-line message of ``exc`` about the file ``path``, naming it once."""
    text, name = describe(exc), one_line(path)
    return text if name in text else f"{name}: {text}"
