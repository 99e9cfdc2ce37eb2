"""Private compute engines: ``point_numba`` (default) and ``point_numpy`` (the oracle).

Both expose the same functions with the same signatures; ``engine(backend)`` returns one.
The numba engine is imported on first use so that ``import advcal`` stays light.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_ENGINE_MODULES = {"numba": "point_numba", "numpy": "point_numpy"}


def engine(backend: str) -> ModuleType:
    """The point-estimator engine module for a validated ``backend`` name."""
    return importlib.import_module(f"advcal._kernels.{_ENGINE_MODULES[backend]}")
