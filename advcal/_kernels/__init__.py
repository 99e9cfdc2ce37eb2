"""Private compute engines, one pair of modules per kernel family.

``<family>_numba`` (the default backend) and ``<family>_numpy`` (the reference, the tests'
oracle) expose the same functions with the same signatures; ``engine(family, backend)``
returns one.  Engines are imported on first use so that ``import advcal`` stays light
(numba's import alone costs about 0.6 s).
"""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType

FAMILIES = ("point", "maxnorm", "ranges", "recovery")


@cache
def engine(family: str, backend: str) -> ModuleType:
    """The ``family`` kernels for a validated ``backend`` ("numba" or "numpy")."""
    return importlib.import_module(f"advcal._kernels.{family}_{backend}")
