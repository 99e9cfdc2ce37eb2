"""What a call costs beyond its kernel: the torch wrapper per call, and a fresh process's
first calls with an empty and with a warm kernel cache.

**Torch wrapper.**  ``advcal.torch.grpo`` on a CPU tensor against ``advcal.grpo`` on the
same values as a numpy array, at the small batches where a per-call overhead shows
(64 x 8, 1024 x 8, float32: the dtype trainers hold rewards in).  The third row is the
least any wrapper can do: the host round trip (``tensor.numpy()``, ``torch.from_numpy``)
around the numpy call.  Target: the wrapper within 1.45x the numpy call.

**First calls.**  Each entry point in a fresh ``python -c`` process with
``NUMBA_CACHE_DIR`` pointed at a temporary folder: first with the folder empty (the
kernels compile), then again on the same folder (they load).  The child times the import
of numba (which advcal's kernels need; a warm first call pays it too where it comes
first), its set-up (imports, input data) and the first call.  ``advcal warmup`` on
an empty folder is timed too.  Every number is one run: minutes in all.

The cases are built only when selected (they import torch or start processes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

from benchmarks import Case, process_env

TORCH_TARGET = "advcal.torch.grpo <= 1.45x advcal.grpo on the same values"

_DATA = "import numpy as np, advcal; x = np.random.default_rng(0).random((64, 8))"
_PAIRS = ("import advcal; from advcal.simulate import paired_scorings; "
          "p = paired_scorings(200, 8, scale=0.02, seed=0)")
# entry point: (set-up, first call); a set-up compiles no kernel of its entry point.
FIRST_CALLS = {
    "grpo": (_DATA, "advcal.grpo(x)"),
    "maxnorm": (_DATA, "advcal.maxnorm(x, tau_res=0.01)"),
    "range_advantages": (_DATA, "advcal.range_advantages(x * 0.5, x * 0.5 + 0.25)"),
    "calibrate_sets": (_PAIRS, "advcal.calibrate_sets(p.a, p.b, alpha=0.1)"),
    "recover": (_PAIRS + "; from advcal.simulate import gram_matrices; "
                "cal = advcal.calibrate_sets(p.a, p.b, alpha=0.1); "
                "sets = advcal.coefficient_sets(p.a[:4], calibration=cal); "
                "gram = gram_matrices(4, 8, seed=2).gram",
                "advcal.recover(sets, gram, tau=0.2)"),
}

_CHILD = """
import time
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
{setup}
t2 = time.perf_counter()
{call}
t3 = time.perf_counter()
import json
print(json.dumps([t2 - t1, t1 - t0, t3 - t2]))
"""


def _child(setup: str, call: str, cache: str) -> list[float]:
    """(set-up, numba import, first call) seconds of one fresh process on ``cache``."""
    code = textwrap.dedent(_CHILD).format(setup=setup, call=call)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=process_env(NUMBA_CACHE_DIR=cache))
    return [float(t) for t in json.loads(out.stdout.strip().splitlines()[-1])]


def _first_calls(quick: bool) -> list[str]:
    names = ["grpo"] if quick else list(FIRST_CALLS)
    lines = [f"{'entry point':<18}{'set-up':>9}{'numba import':>14}"
             f"{'first call, empty cache':>25}{'warm cache':>12}"]
    for name in names:
        setup, call = FIRST_CALLS[name]
        with tempfile.TemporaryDirectory() as cache:
            cold = _child(setup, call, cache)
            warm = _child(setup, call, cache)
        lines.append(f"{name:<18}{warm[0]:8.2f}s{warm[1]:13.2f}s{cold[2]:24.2f}s"
                     f"{warm[2]:11.3f}s")
    if not quick:
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "advcal.cli", "warmup"], check=True,
                           capture_output=True, env=process_env(NUMBA_CACHE_DIR=cache))
            lines.append(f"advcal warmup, empty cache: {time.perf_counter() - start:.1f} s")
    return lines


def _torch_case(rows: int, quick: bool) -> Case:
    import numpy as np
    import torch

    import advcal
    import advcal.torch as act

    tensor = torch.rand(rows, 8, generator=torch.Generator().manual_seed(0))
    array = tensor.numpy().copy()

    def check() -> str:
        ours, ref = act.grpo(tensor), advcal.grpo(array)
        assert ours.dtype == torch.float32 and np.array_equal(ours.numpy(), ref), \
            "advcal.torch.grpo differs from advcal.grpo"
        return "checked before timing: advcal.torch.grpo = advcal.grpo, bit for bit"

    return Case(
        f"torch wrapper per call, grpo {rows} x 8 float32",
        {
            "advcal.torch.grpo (tensor)": lambda: act.grpo(tensor),
            "advcal.grpo (numpy)": lambda: advcal.grpo(array),
            "host round trip + advcal.grpo": lambda: torch.from_numpy(
                advcal.grpo(tensor.numpy())),
        },
        baseline="advcal.grpo (numpy)",
        target=TORCH_TARGET,
        check=check,
    )


def _lazy(name: str, target: str, build: Any) -> Case:
    return Case(name, {}, baseline="", target=target, build=build)


def cases(quick: bool) -> list[Case]:
    out = [_lazy(f"torch wrapper per call, grpo {rows} x 8 float32", TORCH_TARGET,
                 lambda rows=rows: _torch_case(rows, quick))
           for rows in ((64,) if quick else (64, 1024))]
    out.append(Case("first calls in a fresh process, empty and warm kernel cache", {},
                    baseline="", report=lambda: _first_calls(quick)))
    return out
