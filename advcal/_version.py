"""The package version, on the ground floor: the file format records it."""

__version__ = "0.1.0"
