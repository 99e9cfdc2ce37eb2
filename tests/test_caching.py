"""The on-disk kernel cache (``advcal._numba_cache``): it never goes stale, never breaks.

Every case runs fresh Python processes on a copy of the installed package in a temporary
directory, with the cache locations (``NUMBA_CACHE_DIR``, ``HOME``, ``XDG_CACHE_HOME``)
pointed into temporary directories too, so the tests neither use nor touch the caches of
the working tree.  Each process compiles the one small kernel that ``grpo`` uses.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import advcal

PACKAGE = Path(advcal.__file__).resolve().parent
ENGINE = PACKAGE / "_kernels"

# Two groups whose GRPO and RLOO advantages differ: a kernel that picks the wrong rule
# shows.  First group by hand: mean 1/2, deviations ±1/2, sample std sqrt(1/3).
REWARDS = [[0.0, 0.0, 1.0, 1.0], [1.0, 2.0, 4.0, 0.5]]
FIRST_ROW = [-0.5 / (np.sqrt(1 / 3) + 1e-6)] * 2 + [0.5 / (np.sqrt(1 / 3) + 1e-6)] * 2

# Prints, as JSON: grpo of REWARDS on both engines, the cache hits and misses summed over
# every compiled function of the engine modules, where they cache, and all warnings.
PROBE = textwrap.dedent(f"""
    import json, sys, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numpy as np
        import advcal
        r = np.array({REWARDS!r})
        got = advcal.grpo(r)
        ref = advcal.grpo(r, backend="numpy")
    from numba.core.dispatcher import Dispatcher
    from advcal import _numba_cache as caching
    kernels = {{id(v): v for name, m in list(sys.modules.items())
               if name.startswith("advcal._kernels") for v in vars(m).values()
               if isinstance(v, Dispatcher)}}.values()
    used = [k for k in kernels if k.stats.cache_hits or k.stats.cache_misses]
    print(json.dumps(dict(
        package=advcal.__file__, got=got.tolist(), ref=ref.tolist(),
        hits=sum(sum(k.stats.cache_hits.values()) for k in used),
        misses=sum(sum(k.stats.cache_misses.values()) for k in used),
        paths=sorted({{str(k.stats.cache_path) for k in used}}),
        cache_dir=None if caching.cache_dir() is None else str(caching.cache_dir()),
        warnings=[[w.category.__name__, str(w.message)] for w in caught])))
""")


def _copy_package(tmp_path: Path) -> Path:
    """A copy of the installed package, without its compiled files; returns its parent."""
    root = tmp_path / "site"
    shutil.copytree(PACKAGE, root / "advcal", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NUMBA_CACHE_DIR", "PYTHONPATH", "XDG_CACHE_HOME"))}
    env.update(PYTHONPATH=str(root), **extra)
    return env


def _run(root: Path, env: dict[str, str], code: str = PROBE) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, text=True,
                          capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out.get("package", str(root)).startswith(str(root))  # the copy, not the tree
    return out


def _assert_right(out: dict[str, Any]) -> None:
    np.testing.assert_allclose(out["got"][0], FIRST_ROW, rtol=1e-12)
    np.testing.assert_allclose(out["got"], out["ref"], rtol=1e-12, atol=1e-15)


def _cache_warnings(out: dict[str, Any]) -> list[list[str]]:
    return [w for w in out["warnings"] if "cache" in w[1].lower()]


def _cached_env(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    root = _copy_package(tmp_path)
    cache = tmp_path / "numba-cache"
    return root, _env(root, NUMBA_CACHE_DIR=str(cache), HOME=str(tmp_path / "home")), cache


def test_an_edited_engine_constant_recompiles_and_an_unchanged_tree_loads(tmp_path: Path) -> None:
    """modes.py's mode codes are read by point_numba's kernel and by the wrapper that
    passes them.  Swapping GRPO's and RLOO's codes must leave grpo unchanged: a kernel
    cached on point_numba.py alone would keep the old codes and run RLOO's rule."""
    root, env, cache = _cached_env(tmp_path)
    cold = _run(root, env)
    _assert_right(cold)
    assert cold["misses"] > 0 and cold["hits"] == 0
    assert cold["cache_dir"] and cold["cache_dir"].startswith(str(cache))
    assert cold["paths"] == [cold["cache_dir"]]
    assert list(Path(cold["cache_dir"]).glob("*.nbi")), "nothing was cached"

    warm = _run(root, env)  # the same sources: every kernel loads from the cache
    assert warm["hits"] > 0 and warm["misses"] == 0
    assert warm["got"] == cold["got"]

    modes = root / "advcal" / "_kernels" / "modes.py"
    text = modes.read_text()
    assert "\nGRPO = 1" in text and "\nRLOO = 2" in text, "modes.py changed: update this test"
    modes.write_text(text.replace("\nGRPO = 1", "\nGRPO = 2").replace("\nRLOO = 2",
                                                                       "\nRLOO = 1", 1))
    edited = _run(root, env)
    assert edited["misses"] > 0 and edited["hits"] == 0
    assert edited["cache_dir"] != cold["cache_dir"]
    _assert_right(edited)
    assert edited["got"] == cold["got"]


HELPER = """
from advcal._numba_cache import cached_njit

SCALE = {scale}


@cached_njit()
def shift(x):
    return x + {shift}
"""

KERNEL = """
from advcal._numba_cache import cached_njit
from advcal._kernels.zz_probe_helper import SCALE, shift


def _apply(x):
    return shift(x) * SCALE


apply = cached_njit(_apply, nogil=True)
"""

CALL = """
import json
from advcal._kernels import zz_probe_kernel as k
value = k.apply(1.0)
print(json.dumps(dict(value=value, hits=sum(k.apply.stats.cache_hits.values()))))
"""


def test_an_edited_helper_or_constant_in_another_engine_file_recompiles(tmp_path: Path) -> None:
    """A kernel in one engine file calls an ``@njit`` helper and reads a constant of
    another: editing either changes the next process's result."""
    root, env, _ = _cached_env(tmp_path)
    engine = root / "advcal" / "_kernels"
    (engine / "zz_probe_kernel.py").write_text(KERNEL)
    helper = engine / "zz_probe_helper.py"
    helper.write_text(HELPER.format(scale=2.0, shift=1.0))
    assert _run(root, env, CALL) == {"value": 4.0, "hits": 0}
    assert _run(root, env, CALL) == {"value": 4.0, "hits": 1}
    helper.write_text(HELPER.format(scale=3.0, shift=1.0))
    assert _run(root, env, CALL) == {"value": 6.0, "hits": 0}
    helper.write_text(HELPER.format(scale=3.0, shift=2.0))
    assert _run(root, env, CALL) == {"value": 9.0, "hits": 0}


SCRIPT = """
import json
from advcal._numba_cache import cached_njit

SCALE = {scale}


def _times(x):
    return x * SCALE


times = cached_njit(_times)
print(json.dumps(dict(value=times(2.0), hits=sum(times.stats.cache_hits.values()))))
"""


def test_a_kernel_defined_outside_the_engine_recompiles_when_its_file_changes(
        tmp_path: Path) -> None:
    root, env, _ = _cached_env(tmp_path)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(scale=2.0))
    run = f"import runpy; runpy.run_path({str(script)!r})"
    assert _run(root, env, run) == {"value": 4.0, "hits": 0}
    assert _run(root, env, run) == {"value": 4.0, "hits": 1}
    script.write_text(SCRIPT.format(scale=5.0))
    assert _run(root, env, run) == {"value": 10.0, "hits": 0}


TWICE = """
import json
from advcal._numba_cache import cached_njit


def _inverse(x):
    return 1.0 / x


def outcome(kernel):
    try:
        return kernel(0.0)
    except ZeroDivisionError:
        return "raised"


kernels = [cached_njit(_inverse, error_model=model) for model in ("python", "numpy")]
print(json.dumps(dict(values=[outcome(k) for k in kernels],
                      hits=[sum(k.stats.cache_hits.values()) for k in kernels])))
"""


def test_one_function_compiled_with_two_sets_of_options_caches_both(tmp_path: Path) -> None:
    root, env, _ = _cached_env(tmp_path)
    script = tmp_path / "twice.py"
    script.write_text(TWICE)
    run = f"import runpy; runpy.run_path({str(script)!r})"
    # error_model="python" raises on 1/0, "numpy" gives inf: each must load its own code
    assert _run(root, env, run) == {"values": ["raised", float("inf")], "hits": [0, 0]}
    assert _run(root, env, run) == {"values": ["raised", float("inf")], "hits": [1, 1]}


def _checked(blob: bytes) -> bool:
    return hashlib.sha256(blob[32:]).digest() == blob[:32] and len(blob) > 32


def _with_checksum(obj: object) -> bytes:
    payload = pickle.dumps(obj)
    return hashlib.sha256(payload).digest() + payload


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(max(path.stat().st_size, 64)))


def _wrong_pickle(path: Path) -> None:
    # readable files with a valid checksum that hold the wrong objects
    path.write_bytes(_with_checksum("not an index" if path.suffix == ".nbi" else 42))


def test_corrupt_or_unwritable_cache_files_recompile_with_at_most_a_warning(
        tmp_path: Path) -> None:
    """One cache, damaged in turn in every way; each damaged file is a cache miss, the
    kernel is compiled, and the file is written anew."""
    root, env, _ = _cached_env(tmp_path)
    cold = _run(root, env)
    files = sorted(Path(cold["cache_dir"]).glob("*.nb[ic]"))
    assert any(f.suffix == ".nbi" for f in files) and any(f.suffix == ".nbc" for f in files)
    damages = [(_empty, ".nbi.nbc"), (_truncated, ".nbc"), (_garbage, ".nbi"),
               (_wrong_pickle, ".nbc"), (_wrong_pickle, ".nbi")]
    for damage, kinds in damages:
        for f in files:
            if f.suffix in kinds:
                damage(f)
        out = _run(root, env)
        _assert_right(out)
        case = (damage.__name__, kinds)
        assert out["got"] == cold["got"], case
        assert out["misses"] > 0 and out["hits"] == 0, case
        assert _cache_warnings(out) == out["warnings"], case
        assert all(w[0] == "KernelCacheWarning" for w in out["warnings"]), out["warnings"]
        assert all(_checked(f.read_bytes()) for f in files), case  # overwritten
    again = _run(root, env)  # the rewritten files load
    assert again["hits"] > 0 and again["misses"] == 0 and not _cache_warnings(again)

    # Index files replaced by directories can be neither read nor replaced, whoever runs
    # the test (root included): the failed saves only warn.
    for index in Path(cold["cache_dir"]).glob("*.nbi"):
        index.unlink()
        index.mkdir()
    out = _run(root, env)
    _assert_right(out)
    assert out["misses"] > 0 and out["hits"] == 0
    assert {w[0] for w in _cache_warnings(out)} == {"KernelCacheWarning"}, out["warnings"]
    assert any("could not save" in w[1] for w in out["warnings"])


def _read_only(tree: Path) -> None:
    for path in [tree, *tree.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable_again(tree: Path) -> None:
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def _disabled(out: dict[str, Any]) -> list[list[str]]:
    """The cache warnings of a process that cached nothing, checked to be the one expected."""
    assert out["cache_dir"] is None and out["paths"] == ["None"], out
    warned = _cache_warnings(out)
    assert [w[0] for w in warned] == ["KernelCacheDisabledWarning"], out["warnings"]
    return warned


def _tree(top: Path) -> dict[str, bytes | None]:
    """Every path under ``top`` with its bytes (None for a directory), links not followed."""
    return {str(p.relative_to(top)): None if p.is_dir() else p.read_bytes()
            for p in sorted(top.rglob("*"))}


def test_a_read_only_install_caches_in_the_user_cache_not_in_the_package(
        tmp_path: Path) -> None:
    """Root may write into a read-only site-packages; the cache must go to the user's
    cache directory all the same (a package tree is shared by every user of the install)."""
    root = _copy_package(tmp_path)
    home = tmp_path / "home"
    env = _env(root, HOME=str(home))
    before = _tree(root)
    _read_only(root)
    try:
        out = _run(root, env)
    finally:
        _writable_again(root)
    _assert_right(out)
    assert out["cache_dir"] == str(Path(os.path.realpath(home / ".cache" / "advcal"))
                                   / Path(out["cache_dir"]).name), out["cache_dir"]
    assert list(Path(out["cache_dir"]).glob("*.nbi"))
    assert _tree(root) == before  # no __pycache__, no kernels- folder in the package
    assert not _cache_warnings(out), out["warnings"]


def test_a_read_only_install_without_a_writable_home_runs_uncached_and_warns_once(
        tmp_path: Path) -> None:
    root = _copy_package(tmp_path)
    # HOME and XDG_CACHE_HOME lie under a regular file: no directory can be made there,
    # not even by root.
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    env = _env(root, HOME=str(blocker / "home"), XDG_CACHE_HOME=str(blocker / "cache"))
    _read_only(root)
    try:
        out = _run(root, env)
    finally:
        _writable_again(root)
    _assert_right(out)
    (warning,) = _disabled(out)
    assert str(blocker) in warning[1]
    assert not list(tmp_path.rglob("*.nb[ic]"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    """A package copy, the name of its ``kernels-`` folder and of the files a run caches
    there: what an attacker plants entries under."""
    top = tmp_path_factory.mktemp("reference")
    root = _copy_package(top)
    out = _run(root, _env(root, NUMBA_CACHE_DIR=str(top / "cache"), HOME=str(top / "home")))
    leaf = Path(out["cache_dir"])
    names = sorted(p.name for p in leaf.glob("*.nb[ic]"))
    assert any(n.endswith(".nbi") for n in names) and any(n.endswith(".nbc") for n in names)
    return root, leaf.name, names


class _Payload:
    """Unpickles into a directory made at ``marker``: proof that a planted entry ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (self.marker,)


def _plant(folder: Path, leaf: str, names: list[str], marker: Path) -> None:
    """``folder/leaf`` holding, under every cached file's name, a pickle that runs code;
    each carries a valid checksum, as anyone can compute one."""
    (folder / leaf).mkdir(parents=True)
    for name in names:
        (folder / leaf / name).write_bytes(_with_checksum(_Payload(marker)))


def _others_own(path: Path) -> None:
    """Give ``path`` and what it holds to user nobody (65534)."""
    for p in [path, *path.rglob("*")]:
        os.chown(p, 65534, 65534, follow_symlinks=False)


LAYOUTS = ["world-writable NUMBA_CACHE_DIR", "group-writable advcal folder",
           "advcal folder linked to a world-writable one", "advcal folder linked to nobody's"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_cache_others_can_write_is_not_used(
        tmp_path: Path, reference: tuple[Path, str, list[str]], layout: str) -> None:
    """Entries planted where another user could have written them never run: the process
    compiles in memory, warns once and writes nothing there."""
    if layout.endswith("nobody's") and os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    root, leaf, names = reference
    cache = tmp_path / "cache"
    marker = tmp_path / "planted-code-ran"
    if layout.startswith("world"):
        folder = cache / "advcal"
        _plant(folder, leaf, names, marker)
        for p in [cache, folder, folder / leaf]:
            p.chmod(0o777)
    elif layout.startswith("group"):
        folder = cache / "advcal"
        _plant(folder, leaf, names, marker)
        cache.chmod(0o700)
        folder.chmod(0o770)
    else:
        folder = tmp_path / "elsewhere"
        _plant(folder, leaf, names, marker)
        cache.mkdir(mode=0o700)
        (cache / "advcal").symlink_to(folder, target_is_directory=True)
        if layout.endswith("nobody's"):
            _others_own(folder)
        else:
            folder.chmod(0o777)
    before = _tree(tmp_path)
    out = _run(root, _env(root, NUMBA_CACHE_DIR=str(cache), HOME=str(tmp_path / "home")))
    _assert_right(out)
    _disabled(out)
    assert not marker.exists(), "a planted cache entry ran"
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("linked", [False, True], ids=["folder", "advcal folder linked"])
def test_a_folder_of_the_users_own_caches_and_its_new_folders_are_private(
        tmp_path: Path, reference: tuple[Path, str, list[str]], linked: bool) -> None:
    root, leaf, _ = reference
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    target = cache
    if linked:  # a link to a folder of the user's own is fine: the link target is used
        target = tmp_path / "real"
        target.mkdir(mode=0o700)
        (cache / "advcal").symlink_to(target / "advcal", target_is_directory=True)
    env = _env(root, NUMBA_CACHE_DIR=str(cache), HOME=str(tmp_path / "home"))
    cold = _run(root, env)
    _assert_right(cold)
    made = Path(os.path.realpath(target / "advcal")) / leaf
    assert cold["cache_dir"] == str(made) and cold["misses"] > 0 and cold["hits"] == 0
    assert list(made.glob("*.nbi")) and not _cache_warnings(cold), cold["warnings"]
    for folder in (made.parent, made):  # made by advcal: readable by this user only
        assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, oct(folder.stat().st_mode)
    warm = _run(root, env)
    assert warm["hits"] > 0 and warm["misses"] == 0 and warm["got"] == cold["got"]


# Runs PROBE as user nobody where the tests run as root.  The interpreter and its standard
# library may lie where nobody cannot read them (a pyenv under /root): the process imports,
# while still root, every module outside advcal that a run imports, then drops to nobody.
DROP = """
import importlib, json, os
for _name in json.load(open({modules!r})):
    try:
        importlib.import_module(_name)
    except Exception:
        pass
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
"""
LIST_MODULES = PROBE + """
print(json.dumps(dict(package=advcal.__file__, modules=[
    name for name in sys.modules if name != "__main__" and not name.startswith("advcal")])))
"""


@pytest.fixture(scope="module")
def unprivileged() -> Any:
    """(a package copy, a folder to make cases in, the code to run): both folders lie
    outside pytest's private temporary directory, where nobody can read them."""
    public = Path(tempfile.mkdtemp(prefix="advcal-cache-test-"))
    try:
        public.chmod(0o755)
        root = _copy_package(public)
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        code = PROBE
        if os.geteuid() == 0:
            listed = _run(root, _env(root, NUMBA_CACHE_DIR=str(public / "root-cache")),
                          LIST_MODULES)
            modules = public / "modules.json"
            modules.write_text(json.dumps(listed["modules"]))
            modules.chmod(0o644)
            code = DROP.format(modules=str(modules)) + PROBE
        cases = public / "cases"
        cases.mkdir(mode=0o755)
        yield root, cases, code
    finally:
        for p in [public, *public.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o700)
        shutil.rmtree(public)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.parametrize("case", ["read-only NUMBA_CACHE_DIR", "unsearchable NUMBA_CACHE_DIR",
                                  "unsearchable home"])
def test_an_unprivileged_user_without_a_writable_cache_computes_and_warns_once(
        unprivileged: Any, case: str) -> None:
    """Before, ``PermissionError`` escaped from the first call (an ``is_dir`` inside a
    folder the user may not search)."""
    root, cases, code = unprivileged
    folder = cases / case.replace(" ", "-")
    folder.mkdir()
    if os.geteuid() == 0:
        _others_own(folder)  # the unprivileged user's own folder
    # home and XDG_CACHE_HOME: inside the case's folder, never reached where NUMBA_CACHE_DIR
    # is set
    env = _env(root, HOME=str(folder / "home"))
    if case.startswith("read-only"):
        env["NUMBA_CACHE_DIR"] = str(folder)
        folder.chmod(0o500)
    elif case.startswith("unsearchable NUMBA"):
        env["NUMBA_CACHE_DIR"] = str(folder)
        folder.chmod(0o000)
    else:
        folder.chmod(0o000)
    try:
        out = _run(root, env, code)
    finally:
        folder.chmod(0o700)
    _assert_right(out)
    (warning,) = _disabled(out)
    assert str(folder) in warning[1] and "Permission" in warning[1], warning
    assert not list(folder.rglob("*"))


def test_engine_modules_import_only_engine_modules_from_advcal() -> None:
    """The cache is keyed on the files of advcal/_kernels/ and advcal/_numba_cache.py alone: a
    kernel that used code or constants from another advcal module would not be recompiled
    when that module changed."""
    outside = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     and node.level == 0 else [])
            outside += [f"{path.name}: {n}" for n in names
                        if n.split(".")[0] == "advcal"
                        and not n.startswith(("advcal._kernels", "advcal._numba_cache"))]
    assert not outside


def test_engine_modules_compile_through_cached_njit() -> None:
    """numba's own ``cache=True`` goes stale on edits to other files and raises in a
    read-only install: engine modules cache through ``_numba_cache.cached_njit`` only."""
    own = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and any(k.arg == "cache" for k in node.keywords):
                own.append(f"{path.name}:{node.lineno}")
    assert not own
