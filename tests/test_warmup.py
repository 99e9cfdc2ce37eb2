"""``advcal warmup`` and the warning of a process that can cache no kernel.

Each case runs fresh processes with ``NUMBA_CACHE_DIR`` in a temporary folder (the cache
folder is chosen once per process).  An unusable folder is one under a regular file: no
directory can be made there, not even by root, whom file modes do not stop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import advcal
from advcal.cli import main


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "NUMBA_CACHE_DIR": str(cache)}


def _warmup(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advcal.cli", "warmup", *args],
                          capture_output=True, text=True, env=_env(cache), timeout=600,
                          check=False)


def _blocked(tmp_path: Path) -> Path:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    return blocker / "cache"


def test_warmup_compiles_into_the_cache_and_a_second_run_loads(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = _warmup(cache, "--only", "calibrate_sets")
    assert cold.returncode == 0, cold.stderr
    (leaf,) = (cache / "advcal").glob("kernels-*")
    assert str(leaf) in cold.stdout.splitlines()[0]
    assert list(leaf.glob("*.nbi")) and list(leaf.glob("*.nbc"))
    (line,) = [x for x in cold.stdout.splitlines() if x.startswith("calibrate_sets ")]
    assert " 0 compiled" not in line and " 0 already cached" in line
    warm = _warmup(cache, "--only", "calibrate_sets")
    assert warm.returncode == 0, warm.stderr
    (line,) = [x for x in warm.stdout.splitlines() if x.startswith("calibrate_sets ")]
    assert " 0 compiled" in line and " 0 already cached" not in line
    assert "KernelCache" not in cold.stderr + warm.stderr


def test_warmup_without_a_usable_cache_exits_2_with_one_line(tmp_path: Path) -> None:
    cache = _blocked(tmp_path)
    out = _warmup(cache)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("advcal warmup: error: nothing can be cached: ")
    assert str(cache / "advcal") in out.stderr and "NUMBA_CACHE_DIR" in out.stderr
    assert not cache.parent.is_dir()


def test_warmup_refuses_an_unknown_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["warmup", "--only", "nope"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--only" in err and "recover" in err


# Imports every kernel module (each attaches the cache it finds to its kernels) and runs
# grpo, recording every warning.
PROBE = textwrap.dedent("""
    import json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numpy as np
        import advcal
        import advcal._kernels.point_numba, advcal._kernels.maxnorm_numba
        import advcal._kernels.ranges_numba, advcal._kernels.recovery_numba
        got = advcal.grpo(np.array([[0.0, 1.0]])).tolist()
    from advcal._numba_cache import cache_dir, cache_problem
    print(json.dumps(dict(
        got=got, cache_dir=cache_dir() and str(cache_dir()), problem=cache_problem(),
        warnings=[[w.category.__name__, issubclass(w.category, RuntimeWarning),
                   str(w.message)] for w in caught])))
""")


def _probe(cache: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=_env(cache), timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_process_without_a_usable_cache_warns_once_naming_folder_and_variable(
        tmp_path: Path) -> None:
    cache = _blocked(tmp_path)
    out = _probe(cache)
    assert out["got"] == advcal.grpo(np.array([[0.0, 1.0]])).tolist()  # compiled in memory
    assert out["cache_dir"] is None
    (warning,) = [w for w in out["warnings"] if "cache" in w[2].lower()]
    name, is_runtime, message = warning
    assert name == "KernelCacheDisabledWarning" and is_runtime
    assert str(cache / "advcal") in message and "NUMBA_CACHE_DIR" in message
    assert out["problem"] in message  # the text ``advcal warmup`` prints


def test_a_usable_cache_gives_no_warning(tmp_path: Path) -> None:
    out = _probe(tmp_path / "cache")
    assert out["cache_dir"] is not None and out["problem"] is None
    assert not [w for w in out["warnings"] if "cache" in w[2].lower()], out["warnings"]
