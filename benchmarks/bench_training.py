"""The training study (``notebooks/07-training-study.py``) at reduced size: the wall time of
one training step of each method as a ratio to GRPO's step in the same regime, and the
final true reward.

The notebook is the one source of the training loop: this case runs it as a script
(``runpy``, ``ADVCAL_NOTEBOOK_SIZE=reduced``, matplotlib's Agg backend, its own output
suppressed) and reads its result tables from the script's namespace.  A step is sampling,
grading, the method's coefficients, backward and Adam on a policy of a few hundred
parameters, one torch thread; SetGRPO's step includes the per-response Gram capture.  The
times are medians over every step of every seed (5 seeds of 120 steps), so one run is the
measurement: no rounds.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import runpy
import time
from pathlib import Path
from typing import Any

from benchmarks import Case

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07-training-study.py"


def _run_notebook() -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    saved = os.environ.get("ADVCAL_NOTEBOOK_SIZE")
    os.environ["ADVCAL_NOTEBOOK_SIZE"] = "reduced"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return runpy.run_path(str(NOTEBOOK), run_name="__main__")
    finally:
        if saved is None:
            del os.environ["ADVCAL_NOTEBOOK_SIZE"]
        else:
            os.environ["ADVCAL_NOTEBOOK_SIZE"] = saved


def _report() -> list[str]:
    start = time.perf_counter()
    ns = _run_notebook()
    elapsed = time.perf_counter() - start
    lines = []
    for regime, title in ns["REGIMES"].items():
        rows = [row for row in ns["table"] if row[0] == regime]
        grpo = next(row for row in rows if row[1] == "grpo")
        lines.append(f"({regime}) {title}: GRPO step {grpo[5]:.2f} ms (median), final true "
                     f"reward {grpo[2]:.3f}")
        for _, method, final, diff, p, ms, ratio in rows:
            if method != "grpo":
                lines.append(f"    {method:<11} step {ratio:5.2f}x GRPO's ({ms:.2f} ms); final "
                             f"true reward {final:.3f} ({diff:+.3f}, paired p = {p:.2g})")
    lines.append(f"the whole notebook at reduced size: {elapsed:.1f} s "
                 f"({ns['N_SEEDS']} seeds x {ns['STEPS']} steps, one torch thread)")
    return lines


def cases(quick: bool) -> list[Case]:
    if any(importlib.util.find_spec(name) is None for name in ("torch", "matplotlib")):
        return []
    return [Case("training study (notebook 07, reduced size): step time per method against "
                 "GRPO's, and the final true reward", {}, "", report=_report)]
