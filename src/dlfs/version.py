"""The DLFS release, importable without loading the client (the daemon reports it)."""

__version__ = "0.1.0"
