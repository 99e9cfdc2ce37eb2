"""Private compute engines, one pair of modules per kernel family.

``<family>_numba`` (the default backend) and ``<family>_numpy`` (the reference, the tests'
oracle) expose the same functions with the same signatures; ``engine(family, backend)``
returns one.  Engines are imported on first use, so ``import advcal`` stays light and the
numpy backend never imports numba.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Literal

Family = Literal["point", "maxnorm", "ranges", "recovery"]
Backend = Literal["numba", "numpy"]


@cache
def engine(family: Family, backend: Backend | str) -> ModuleType:
    """The ``family`` kernels for a validated ``backend`` ("numba" or "numpy")."""
    if backend == "numba":
        from advcal._kernels import maxnorm_numba, point_numba, ranges_numba, recovery_numba
        return {"point": point_numba, "maxnorm": maxnorm_numba, "ranges": ranges_numba,
                "recovery": recovery_numba}[family]
    if backend == "numpy":
        from advcal._kernels import maxnorm_numpy, point_numpy, ranges_numpy, recovery_numpy
        return {"point": point_numpy, "maxnorm": maxnorm_numpy, "ranges": ranges_numpy,
                "recovery": recovery_numpy}[family]
    raise KeyError(backend)
