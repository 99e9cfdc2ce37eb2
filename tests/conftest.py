"""Hypothesis profiles and the backend fixture shared by every test module.

Profiles: ``default`` (fast, for development), ``ci`` (more examples) and ``stress`` (by
hand), chosen with the HYPOTHESIS_PROFILE environment variable; ``.ci/run`` selects ``ci``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# For a developer hunting edge cases by hand; not run in CI.
settings.register_profile(
    "stress",
    max_examples=3000,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(params=["numba", "numpy"])
def backend(request: pytest.FixtureRequest) -> str:
    """Every engine-backed public function is tested on both engines."""
    return request.param
