"""blockdraft: train block drafters for speculative decoding and ship them to vLLM."""

import os

# The one place the version is defined: pyproject.toml reads it from here (tool.setuptools.dynamic).
__version__ = "0.1.0"

# Nothing is downloaded at run time, whichever way an app starts (`blockdraft <app>`, `python -m`, torchrun):
# a target is a local directory, and a hub dataset id must already be in the local Hugging Face cache. Set
# before any Hugging Face library reads it at import. `HF_HUB_OFFLINE=0` in the environment lets `datasets`
# fetch a hub dataset id.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
