"""The package version: the one place it is written.

`pyproject.toml` reads it (`[tool.setuptools.dynamic]`), and `constrained_decoding.__version__`
is the installed distribution's metadata version, falling back to this constant when
the package runs from a source tree that was never installed.
"""

__version__ = "0.1.0"

# The distribution name (what `pip` installs); the import name stays `constrained_decoding`.
DISTRIBUTION = "jax-constrained-decoding"
