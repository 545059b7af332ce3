"""The package version, importable without the package's lazy public API."""

__version__ = "0.1.0"
