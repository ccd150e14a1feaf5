"""The package version (one place: ``metasampler.__version__`` and sampler files read it)."""

__version__ = "0.2.0"
