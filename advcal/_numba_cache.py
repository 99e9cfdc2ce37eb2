"""The one way advcal compiles numba kernels with an on-disk cache: ``cached_njit``.

numba's own ``cache=True`` keys a cached kernel on the file that defines it, so a kernel
keeps running old code after an edit to a constant or an ``@njit`` helper it imports from
another file; it raises on a corrupt cache file; it raises ``cannot cache function`` when no
cache directory is writable; and it loads whatever a directory others can write holds.
Here instead:

- every kernel's cache lives in a directory named after a content hash of the engine
  sources (every ``*.py`` in ``advcal/_kernels/``, and this file), and the index records
  that hash: any change to any engine file recompiles every kernel.  The engine modules
  import nothing else from ``advcal`` (a test checks), so the hash covers all they use.
  A kernel defined in another file (an integration, a script) adds that file's hash;
- a cached kernel is keyed on its compile options as well as its signature, so one
  function compiled with two sets of options (fastmath flags, error model) keeps two entries;
- an index or data file that cannot be read (empty, truncated, corrupt, not numba's) is a
  cache miss: the kernel is compiled and the file overwritten, with a ``KernelCacheWarning``;
  a failed save also only warns.  Files carry a checksum, so corrupt bytes never reach the
  unpickler or the linker;
- the cache goes to ``$NUMBA_CACHE_DIR/advcal`` where ``NUMBA_CACHE_DIR`` is set, and to the
  user cache directory otherwise (``$XDG_CACHE_HOME/advcal``, by default
  ``~/.cache/advcal``), never into the installed package.  It holds one
  ``kernels-<source hash>`` directory.  A checksum only catches damage, not a planted entry,
  and a cached entry is unpickled and linked into the process: so the cache is used only
  where no other user can have written it.  Every directory on its resolved path must be
  owned by this user or by root and be writable by no one else (a sticky directory such as
  ``/tmp`` excepted); the ``advcal`` directory, the ``kernels-`` one and any directory
  created on the way (mode 0700) must be this user's own.  Where that fails, or nothing can
  be created or written there, kernels are compiled in memory only, with one
  ``KernelCacheDisabledWarning`` per process that names the folder tried, the reason and
  ``NUMBA_CACHE_DIR`` (``cache_problem`` returns that text; ``advcal warmup`` prints it).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from numba import njit
from numba.core import config
from numba.core.caching import (
    CompileResultCacheImpl,
    FunctionCache,
    IndexDataCacheFile,
    NullCache,
    _CacheLocator,
)
from numba.misc.appdirs import user_cache_dir

__all__ = ["KernelCacheDisabledWarning", "KernelCacheWarning", "cache_dir", "cache_problem",
           "cached_njit", "source_hash"]

ENGINE_DIR = Path(__file__).resolve().parent / "_kernels"
_PREFIX = "kernels-"
_DIGEST = hashlib.sha256().digest_size
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class KernelCacheWarning(RuntimeWarning):
    """A kernel cache file could not be read or written; the kernel was compiled instead."""


class KernelCacheDisabledWarning(KernelCacheWarning):
    """No cache directory is safe and writable: this process compiles kernels in memory."""


@cache
def source_hash() -> str:
    """Hex digest of the names and contents of the engine sources, once per process (at
    the first compiled kernel), so that it describes the code this process runs."""
    h = hashlib.sha256()
    for path in [*sorted(ENGINE_DIR.glob("*.py")), Path(__file__).resolve()]:
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:20]


class _Unsafe(Exception):
    """A cache directory that must not be used; the message says why."""


def _user_folder() -> Path:
    """``$XDG_CACHE_HOME/advcal`` (a relative value is ignored, as the XDG spec says),
    else ``~/.cache/advcal``; the platform's own cache directory on macOS and Windows."""
    if sys.platform in ("darwin", "win32"):
        return Path(user_cache_dir("advcal", appauthor=False))
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return Path(xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache"), "advcal")


def _check(path: str, st: os.stat_result, own: bool) -> None:
    """Raise _Unsafe unless no other user can write ``path`` or rename what it holds.

    ``own``: advcal's directories, which must be this user's; other directories on the way
    may be root's, and may be writable by others where the sticky bit stops those others
    from renaming or removing what this user put there."""
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):  # resolved beforehand: a link now is one made since
        raise _Unsafe(f"{path} became a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise _Unsafe(f"{path} is not a directory")
    if st.st_uid != euid and (own or st.st_uid != 0):
        raise _Unsafe(f"{path} is owned by uid {st.st_uid}, not by this user (uid {euid})")
    if st.st_mode & _OTHERS_WRITE and (own or not st.st_mode & stat.S_ISVTX):
        raise _Unsafe(f"{path} is writable by other users (mode {stat.filemode(st.st_mode)})")


def _safe_dir(folder: Path, leaf: str) -> Path:
    """``folder/leaf``, resolved, created where missing (mode 0700), checked and writable;
    raises _Unsafe or OSError.  Nothing is created below a directory that fails its check."""
    if not folder.is_absolute():  # e.g. an unexpanded "~": it would cache under the cwd
        raise _Unsafe(f"{str(folder)!r} is not an absolute path")
    target = Path(os.path.realpath(folder / leaf))
    if os.name != "posix":  # no uids or mode bits to check: the user profile's ACLs apply
        target.mkdir(parents=True, exist_ok=True)
    else:
        # realpath keeps a missing tail as written: its last two names are still advcal's
        parts = target.parts
        for i in range(1, len(parts) + 1):
            path = os.path.join(*parts[:i])
            created = False
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                try:
                    os.mkdir(path, 0o700)
                    created = True
                except FileExistsError:  # made by someone else meanwhile: checked below
                    pass
                st = os.lstat(path)
            _check(path, st, own=created or i >= len(parts) - 1)
    tempfile.TemporaryFile(dir=target).close()
    return target


_lock = threading.Lock()


def cache_dir() -> Path | None:
    """The directory this process caches compiled kernels in, or None (no caching).

    Decided once per process, at the first compiled kernel; where it is None, one
    ``KernelCacheDisabledWarning`` says why."""
    with _lock:  # engine modules imported on two threads: still one decision, one warning
        return _find_cache_dir()


def cache_problem() -> str | None:
    """Why this process caches no kernels (the folder tried, the reason, and how to choose
    another folder), or None where it caches them: what the warning of ``cache_dir`` says."""
    with _lock:
        return _locate()[1]


@cache
def _find_cache_dir() -> Path | None:
    path, problem = _locate()
    if path is None:
        warnings.warn(f"advcal compiles its numba kernels in memory in this process; nothing is "
                      f"cached on disk: {problem}", KernelCacheDisabledWarning, stacklevel=4)
    return path


@cache
def _locate() -> tuple[Path | None, str | None]:
    """The cache directory, or None and why not."""
    numba_dir = getattr(config, "CACHE_DIR", "")  # NUMBA_CACHE_DIR, as numba read it
    # (NUMBA_CACHE_DIR names the one place to cache: never another one behind its back)
    folder = None
    try:
        folder = Path(numba_dir, "advcal").absolute() if numba_dir else _user_folder()
        return _safe_dir(folder, _PREFIX + source_hash()), None
    except (_Unsafe, OSError, KeyError, RuntimeError) as exc:  # KeyError: no home for "~"
        reason = str(exc) if isinstance(exc, _Unsafe) else f"{type(exc).__name__}: {exc}"
    # Without a cache every new process compiles again, for seconds per entry point: say
    # where the cache was looked for and how to choose another folder.
    tried = f"the cache folder {folder}" if folder is not None else "the user cache folder"
    return None, (f"{tried} cannot be used ({reason}), so every new process compiles the "
                  "kernels again; set NUMBA_CACHE_DIR to a folder of your own (writable by "
                  "you only) to cache them there")


def _warn(message: str) -> None:
    warnings.warn(message, KernelCacheWarning, stacklevel=2)


class _EngineLocator(_CacheLocator):
    """Every kernel in one directory per engine-source hash, stamped with that hash."""

    def __init__(self, py_func: Callable[..., Any], path: Path) -> None:
        self._py_file = py_func.__code__.co_filename
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(path)

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        if Path(self._py_file).resolve().parent == ENGINE_DIR:
            return source_hash()
        return source_hash() + hashlib.sha256(Path(self._py_file).read_bytes()).hexdigest()

    def get_disambiguator(self) -> str:
        return str(self._lineno)


class _EngineCacheImpl(CompileResultCacheImpl):
    # numba's CacheImpl picks a locator from a global list (or NUMBA_CACHE_LOCATOR_CLASSES);
    # this one always uses the engine locator, found by ``cache_dir`` beforehand.
    def __init__(self, py_func: Callable[..., Any]) -> None:
        path = cache_dir()
        assert path is not None  # cached_njit attaches no cache otherwise
        self._lineno = py_func.__code__.co_firstlineno
        self._locator = _EngineLocator(py_func, path)
        modname = Path(py_func.__code__.co_filename).stem
        qualname = getattr(py_func, "__qualname__", py_func.__name__)
        abiflags = getattr(sys, "abiflags", "")
        self._filename_base = self.get_filename_base(f"{modname}.{qualname}", abiflags)


class _CheckedCacheFile(IndexDataCacheFile):
    """Index and data files as ``sha256(payload) + payload``; anything unreadable is a miss
    (an empty index, so the next save rewrites the index and its data file from scratch)."""

    def _read_checked(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return None
        digest, payload = blob[:_DIGEST], blob[_DIGEST:]
        if len(blob) <= _DIGEST or hashlib.sha256(payload).digest() != digest:
            raise ValueError(f"checksum mismatch in {path}")
        return payload

    def _write_checked(self, path: str, obj: Any) -> None:
        payload = self._dump(obj)
        with self._open_for_write(path) as f:
            f.write(hashlib.sha256(payload).digest())
            f.write(payload)

    def _load_index(self) -> dict[Any, str]:
        try:
            payload = self._read_checked(self._index_path)
            if payload is None:
                return {}
            version, stamp, overloads = pickle.loads(payload)
            if not isinstance(overloads, dict):
                raise TypeError("index is not a mapping")
        except Exception as exc:
            # a save reads the index again first: warn once
            if not getattr(self, "_warned", False):
                _warn(f"ignoring unreadable kernel cache index {self._index_path}: {exc!r}")
            self._warned = True
            return {}
        if version != self._version or stamp != self._source_stamp:
            return {}  # another numba or other sources: stale, overwritten on save
        return overloads

    def _save_index(self, overloads: dict[Any, str]) -> None:
        self._write_checked(self._index_path, (self._version, self._source_stamp, overloads))

    def _load_data(self, name: str) -> Any:
        payload = self._read_checked(self._data_path(name))
        if payload is None:
            raise FileNotFoundError(name)  # numba's ``load`` treats OSError as a miss
        return pickle.loads(payload)

    def _save_data(self, name: str, data: Any) -> None:
        self._write_checked(self._data_path(name), data)


class _EngineCache(FunctionCache):
    """numba's per-function cache, with the engine locator and failures demoted to warnings;
    its entries are keyed on the compile options too (numba's key omits them, so the same
    function compiled twice, say with other fastmath flags, would load the other's code)."""

    _impl_class = _EngineCacheImpl

    def __init__(self, py_func: Callable[..., Any], options: dict[str, Any]) -> None:
        super().__init__(py_func)
        self._options = repr(sorted((name, sorted(value) if isinstance(value, (set, frozenset))
                                     else value) for name, value in options.items()))
        self._cache_file = _CheckedCacheFile(
            cache_path=self._cache_path,
            filename_base=self._impl.filename_base,
            source_stamp=self._impl.locator.get_source_stamp(),
        )

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        return (*super()._index_key(sig, codegen), self._options)

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            return super().load_overload(sig, target_context)
        except Exception as exc:  # e.g. a data file of another build: compile instead
            _warn(f"ignoring unreadable kernel cache entry of {self._name}: {exc!r}")
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            super().save_overload(sig, data)
        except Exception as exc:
            _warn(f"could not save the compiled {self._name} to {self._cache_path}: {exc!r}")


def cached_njit(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """``numba.njit(**options)(fn)`` with the cache described above (never ``cache=``).

    Use as ``cached_njit(fn, nogil=True)`` or as a decorator ``@cached_njit(fastmath=...)``.
    """
    if "cache" in options:
        raise TypeError("cached_njit: the cache is always on; drop the 'cache' option")
    if fn is None:
        return lambda f: cached_njit(f, **options)
    dispatcher = njit(**options)(fn)
    # (a function typed at a prompt has no source file to stamp its cache with)
    cacheable = cache_dir() is not None and Path(fn.__code__.co_filename).is_file()
    dispatcher._cache = _EngineCache(fn, options) if cacheable else NullCache()
    return dispatcher
