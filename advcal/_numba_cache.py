"""The one way advcal compiles numba kernels with an on-disk cache: ``cached_njit``.

numba's own ``cache=True`` keys a cached kernel on the file that defines it, so a kernel
keeps running old code after an edit to a constant or an ``@njit`` helper it imports from
another file; it raises on a corrupt cache file; and it raises ``cannot cache function``
when no cache directory is writable.  Here instead:

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
- the cache goes to the first writable one of ``$NUMBA_CACHE_DIR/advcal``,
  ``advcal/_kernels/__pycache__`` and the user cache directory (``$XDG_CACHE_HOME/advcal``,
  by default ``~/.cache/advcal``), each holding one ``kernels-<source hash>`` directory;
  with none writable, kernels are compiled in memory only.
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
import sys
import tempfile
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

__all__ = ["KernelCacheWarning", "cache_dir", "cached_njit", "source_hash"]

ENGINE_DIR = Path(__file__).resolve().parent / "_kernels"
_PREFIX = "kernels-"
_DIGEST = hashlib.sha256().digest_size


class KernelCacheWarning(RuntimeWarning):
    """A kernel cache file could not be read or written; the kernel was compiled instead."""


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


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


@cache
def cache_dir() -> Path | None:
    """The directory this process caches compiled kernels in, or None (no caching)."""
    leaf = _PREFIX + source_hash()
    in_tree = ENGINE_DIR / "__pycache__"
    roots = [in_tree]
    numba_dir = getattr(config, "CACHE_DIR", "")  # NUMBA_CACHE_DIR, as numba read it
    if numba_dir:
        roots.insert(0, Path(numba_dir).absolute() / "advcal")
    try:
        roots.append(Path(user_cache_dir("advcal", appauthor=False)))
    except (OSError, KeyError, RuntimeError):  # no home directory to expand "~" into
        pass
    # (a root left relative, e.g. an unexpanded "~", would cache under the cwd: skipped)
    for root in roots:
        created = not (root / leaf).is_dir()
        if root.is_absolute() and _writable(root / leaf):
            if created and root == in_tree:
                # The package's own cache holds kernels of earlier versions of this tree
                # only: drop them.  Shared locations may serve other installs.
                for old in in_tree.glob(_PREFIX + "*"):
                    if old.name != leaf:
                        shutil.rmtree(old, ignore_errors=True)
            return root / leaf
    return None


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
