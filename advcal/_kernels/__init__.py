"""Private compute engines, one pair of modules per kernel family.

``<family>_numba`` (the default backend) and ``<family>_numpy`` (the reference, the tests'
oracle) expose the same functions with the same signatures; ``engine(family, backend)``
returns one, by the explicit map below.  Engines are imported on first use so that
``import advcal`` stays light (numba's import is slow).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import Literal

Family = Literal["point", "maxnorm", "ranges", "recovery"]
Backend = Literal["numba", "numpy"]


def _point_numba() -> ModuleType:
    from advcal._kernels import point_numba
    return point_numba


def _point_numpy() -> ModuleType:
    from advcal._kernels import point_numpy
    return point_numpy


def _maxnorm_numba() -> ModuleType:
    from advcal._kernels import maxnorm_numba
    return maxnorm_numba


def _maxnorm_numpy() -> ModuleType:
    from advcal._kernels import maxnorm_numpy
    return maxnorm_numpy


def _ranges_numba() -> ModuleType:
    from advcal._kernels import ranges_numba
    return ranges_numba


def _ranges_numpy() -> ModuleType:
    from advcal._kernels import ranges_numpy
    return ranges_numpy


def _recovery_numba() -> ModuleType:
    from advcal._kernels import recovery_numba
    return recovery_numba


def _recovery_numpy() -> ModuleType:
    from advcal._kernels import recovery_numpy
    return recovery_numpy


# (family, backend) -> loader; the imports stay inside the loaders so that numba is
# imported only when a numba kernel is first used.
_ENGINES: dict[tuple[str, str], Callable[[], ModuleType]] = {
    ("point", "numba"): _point_numba,
    ("point", "numpy"): _point_numpy,
    ("maxnorm", "numba"): _maxnorm_numba,
    ("maxnorm", "numpy"): _maxnorm_numpy,
    ("ranges", "numba"): _ranges_numba,
    ("ranges", "numpy"): _ranges_numpy,
    ("recovery", "numba"): _recovery_numba,
    ("recovery", "numpy"): _recovery_numpy,
}


@cache
def engine(family: Family, backend: Backend | str) -> ModuleType:
    """The ``family`` kernels for a validated ``backend`` ("numba" or "numpy")."""
    return _ENGINES[family, backend]()
