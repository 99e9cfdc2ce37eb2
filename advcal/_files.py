"""Opening and replacing user files.  Only regular files are read or replaced: a FIFO would
block forever, a device such as ``/dev/zero`` reads without end, and renaming over a
symlink or a device node would replace it with a regular file."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def user_path(path: Any, what: str) -> Path:
    """``path`` as a :class:`~pathlib.Path`; a ``TypeError`` naming ``what`` for anything
    but ``str`` or ``os.PathLike[str]`` (bytes paths included)."""
    if isinstance(path, (bytes, bytearray)) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`{what}` must be a str or path-like object; got "
                        f"{type(path).__name__}.")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"`{what}` must be a str or path-like object naming a str path; got "
                        f"a path of {type(text).__name__}.")
    if "\0" in text:
        raise ValueError(f"`{what}` holds a NUL character.")
    return Path(text)


def kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (for messages)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def open_regular(path: Path, what: str) -> tuple[IO[bytes], int]:
    """``(binary file, size in bytes)`` of the regular file at ``path`` (a symlink to one
    is followed).  Anything else is an ``OSError`` naming ``what`` and the file, raised
    without blocking: the file is opened non-blocking and checked by ``fstat``."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise type(exc)(exc.errno, f"{what} {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{what} {path}: {kind(info.st_mode)}, not a regular file; "
                          "only regular files are read.")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), info.st_size
    except BaseException:
        os.close(fd)
        raise


def check_target(path: Path, what: str) -> None:
    """An ``OSError`` where ``path`` exists and is not a regular file (a symlink, FIFO,
    device node or directory): replacing it would destroy what it is."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{what} {path}: {kind(info.st_mode)}; refusing to replace it with "
                      "a regular file (write to a regular file's path).")


def _umask() -> int:
    # Linux reports the umask in /proc; elsewhere it can only be read by setting it (and
    # straight back), which another thread creating a file at that instant could see.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[IO[bytes]], None], what: str) -> None:
    """Write a regular file at ``path`` by ``write(binary file)`` into a temporary file in
    the same folder, then rename it over ``path``: a reader never sees half a file.  The
    file's mode follows the umask (``0o666 & ~umask``), as ``open(path, "w")`` would give;
    a non-regular target is refused (:func:`check_target`)."""
    check_target(path, what)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
        check_target(path, what)  # made non-regular while we wrote
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
