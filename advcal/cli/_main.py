"""The ``advcal`` parser and its error net.

Each subcommand is a module (:mod:`~advcal.cli.demo`, :mod:`~advcal.cli.diagnose`,
:mod:`~advcal.cli.calibrate`) whose ``COMMAND`` names it and holds its
``add_arguments(parser)`` and ``run(args)``; ``run`` returns the exit code, 0 on success.
:func:`main` is the one place that turns a bad file or option into one line on stderr
and exit code 2: a :class:`~advcal.cli._errors.CommandError` a command raises, or what a
reader raises for a bad file (:func:`~advcal.cli._errors.is_bad_input`), so a reader
error no command anticipated still ends in it; anything else is a bug and keeps its
traceback.  A closed stdout (``advcal diagnose LOG | head -1``) ends quietly with exit
code 141, as a tool killed by SIGPIPE; Ctrl-C ends quietly with 130.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from advcal.cli._errors import (
    EXIT_BAD_INPUT,
    EXIT_CLOSED_PIPE,
    EXIT_INTERRUPTED,
    CommandError,
    bad_input_types,
    describe,
    is_bad_input,
    one_line,
)
from advcal.cli.calibrate import COMMAND as CALIBRATE
from advcal.cli.demo import COMMAND as DEMO
from advcal.cli.diagnose import COMMAND as DIAGNOSE
from advcal.cli.warmup import COMMAND as WARMUP

_COMMANDS = (DEMO, DIAGNOSE, CALIBRATE, WARMUP)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line like every other error (exit code 2), and
    that reads ``-1e-3`` as a number (argparse's own rule knows no exponents, so
    ``--bounds -1e-3 1`` was an unknown option)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{one_line(self.prog)}: error: {one_line(message)} "
                                  f"(see {one_line(self.prog)} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``advcal`` parser: a subparser per command, each with its ``run`` and ``prog``
    as defaults."""
    parser = _Parser(prog="advcal", description="Advantage calibration for group-relative RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(child)
        child.set_defaults(run=command.run, prog=child.prog)
    return parser


def _fail(prog: str, text: str) -> int:
    print(f"{prog}: error: {text}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _report(prog: str, exc: BaseException, args: argparse.Namespace | None) -> int:
    """Print ``exc`` as the one error line of ``prog``; it names the input file unless
    it names the file (or the ``--sets`` file) already."""
    text = describe(exc)
    named = [one_line(getattr(args, key)) for key in ("file", "sets")
             if isinstance(getattr(args, key, None), str)]
    if named and not any(name in text for name in named):
        text = f"{named[0]}: {text}"
    return _fail(prog, text)


@contextlib.contextmanager
def _escaped_output() -> Iterator[None]:
    """stdout and stderr write what they cannot encode backslash-escaped (a file name's
    undecodable bytes, a lone surrogate in a column name) instead of raising; restored
    after."""
    saved = []
    for stream in (sys.stdout, sys.stderr):
        errors = getattr(stream, "errors", None)
        if errors in (None, "backslashreplace") or not hasattr(stream, "reconfigure"):
            continue
        try:
            stream.reconfigure(errors="backslashreplace")
        except (OSError, ValueError):  # reconfigure flushes: a closed pipe or stream
            continue
        saved.append((stream, errors))
    try:
        yield
    finally:
        for stream, errors in saved:
            with contextlib.suppress(OSError, ValueError):
                stream.reconfigure(errors=errors)


def _drop_stdout() -> None:
    """Point a closed stdout at the null device: the interpreter's last flush at exit
    then succeeds instead of printing an ignored BrokenPipeError (Python's own recipe)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no file descriptor (captured output)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``advcal`` console script; returns the exit code.

    0 on success; 2 with one line on stderr for a bad file or option (argparse's usage
    errors too, by ``SystemExit(2)``); 141, silently, when stdout is closed by its
    reader (``| head``); 130 on Ctrl-C.  Only a command's ``CommandError`` and what
    :func:`~advcal.cli._errors.is_bad_input` accepts are reported as one line: any other
    exception is a bug and propagates.
    """
    parser = build_parser()
    args: argparse.Namespace | None = None
    with _escaped_output():
        try:
            args = parser.parse_args(argv)
            try:
                code = int(args.run(args))
            except CommandError as exc:
                code = _fail(args.prog, one_line(str(exc)))
            sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
            return code
        except BrokenPipeError:
            _drop_stdout()
            return EXIT_CLOSED_PIPE
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        except bad_input_types() as exc:
            if not is_bad_input(exc):
                raise
            return _report(getattr(args, "prog", parser.prog), exc, args)
