"""Temporary: the readers moved to advcal.io.logs (this file goes once every import moved)."""
from advcal.io.logs import *  # noqa: F403
from advcal.io.logs import __all__  # noqa: F401
