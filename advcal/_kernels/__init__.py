"""Private compute engines, one pair of modules per kernel family.

``<family>_numba`` (the default backend) and ``<family>_numpy`` (the reference, the tests'
oracle) expose the same functions with the same signatures; ``engine(family, backend)``
returns one.  Engines are imported on first use so that ``import advcal`` stays light
(numba's import is slow).
"""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Literal

Family = Literal["point", "maxnorm", "ranges", "recovery"]
Backend = Literal["numba", "numpy"]


@cache
def engine(family: Family, backend: Backend | str) -> ModuleType:
    """The ``family`` kernels for a validated ``backend`` ("numba" or "numpy").

    One import per engine, so numba is imported only when a numba kernel is first used.
    """
    key = (family, backend)
    if key == ("point", "numba"):
        from advcal._kernels import point_numba
        return point_numba
    if key == ("point", "numpy"):
        from advcal._kernels import point_numpy
        return point_numpy
    if key == ("maxnorm", "numba"):
        from advcal._kernels import maxnorm_numba
        return maxnorm_numba
    if key == ("maxnorm", "numpy"):
        from advcal._kernels import maxnorm_numpy
        return maxnorm_numpy
    if key == ("ranges", "numba"):
        from advcal._kernels import ranges_numba
        return ranges_numba
    if key == ("ranges", "numpy"):
        from advcal._kernels import ranges_numpy
        return ranges_numpy
    if key == ("recovery", "numba"):
        from advcal._kernels import recovery_numba
        return recovery_numba
    if key == ("recovery", "numpy"):
        from advcal._kernels import recovery_numpy
        return recovery_numpy
    raise KeyError(key)
