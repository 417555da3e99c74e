"""blockdraft: train block drafters for speculative decoding and ship them to vLLM."""

# The one place the version is defined: pyproject.toml reads it from here (tool.setuptools.dynamic).
__version__ = "0.1.0"
