"""Temporary: the calibration files moved to advcal.io.artefacts."""
from advcal.io.artefacts import *  # noqa: F403
from advcal.io.artefacts import __all__  # noqa: F401
