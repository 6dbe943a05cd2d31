"""The library's version (one place: the package, presets' metadata and the hub client read it)."""

__version__ = "0.1.0"
