"""Is everything the product needs in place on this machine? One line a check, with the fix where it is not.

    blockdraft doctor [vllm_python=<path>]
    python -m blockdraft.doctor [vllm_python=<path>]

ok       in place
warn     something optional is absent or worth knowing (no GPU on a CPU machine, a target not made yet)
missing  the CPU product needs it (the training environment's torch, the serving environment's vLLM): exit 1

It downloads nothing and never imports vLLM: the serving interpreter is asked for its packages' metadata only.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from blockdraft.errors import ConfigError, DataError
from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON, REPO_ROOT

SERVING_FIX = "run `make setup-serve` (or give vllm_python=<a python with vLLM>)"
TINY_TARGET = REPO_ROOT / ".cache" / "targets" / "tiny-qwen3"
# The README's first run writes it (its recipe's target builds itself where it is missing).
TINY_FIX = "run the README's first run: `.venv/bin/blockdraft train experiment=tiny_cpu run_dir=runs/first`"


@dataclass
class Finding:
    name: str
    status: str  # ok, warn or missing
    what: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<8} {self.name:<14} {self.what}" + (f"  fix: {self.fix}" if self.fix else "")


@dataclass
class DoctorSettings:
    vllm_python: Optional[str] = None
    """The serving interpreter; null = <repo>/.venv-serve/bin/python (built by `make setup-serve`)."""


def cache_locations() -> dict:
    """Where the product keeps what it computes once per machine, and the Hugging Face cache it reads."""
    from huggingface_hub import constants

    from blockdraft.cache_paths import cache_root, round_cost_record, token_files_dir

    return {"cache root": cache_root(), "token files": token_files_dir(), "round costs": round_cost_record(),
            "hf cache": Path(constants.HF_HUB_CACHE)}


def python_version() -> Finding:
    from importlib.metadata import PackageNotFoundError, metadata

    running = ".".join(map(str, sys.version_info[:3]))
    try:
        needs = metadata("blockdraft")["Requires-Python"] or ""
    except PackageNotFoundError:
        return Finding("python", "warn", f"{running}; blockdraft is not installed", "run `make setup`")
    from packaging.specifiers import SpecifierSet

    if running in SpecifierSet(needs):
        return Finding("python", "ok", f"{running} (blockdraft needs {needs})")
    return Finding("python", "missing", f"{running}, but blockdraft needs {needs}",
                   f"rebuild .venv with a Python {needs} (make setup PYTHON=<it>)")


def training_torch() -> Finding:
    try:
        import torch
    except ImportError:
        return Finding("training env", "missing", f"{sys.executable} cannot import torch", "run `make setup`")
    return Finding("training env", "ok", f"{sys.executable}: torch {torch.__version__}")


def serving_env(python: Path) -> List[Finding]:
    """The serving interpreter's vLLM (needed) and the project's vLLM plugin (for other stacks' drafts)."""
    from blockdraft.pipeline.serving_stack import serving_versions

    if not python.is_file():
        return [Finding("serving env", "missing", f"no interpreter at {python}", SERVING_FIX)]
    try:
        found = serving_versions(python, timeout_s=20)
    except ConfigError as err:
        return [Finding("serving env", "missing", str(err).split(";")[0], SERVING_FIX)]
    packages = ", ".join(f"{name} {version}" for name, version in found.items() if name != "blockdraft-vllm-plugin")
    plugin = found.get("blockdraft-vllm-plugin")
    return [Finding("serving env", "ok", f"{python}: {packages}"),
            Finding("vllm plugin", "ok", f"blockdraft-vllm-plugin {plugin}") if plugin else
            Finding("vllm plugin", "warn", "blockdraft-vllm-plugin is not installed for the serving interpreter "
                    "(other stacks' drafts will not load)", "run `make setup-serve`")]


def speculators_env() -> Finding:
    python = REPO_ROOT / ".venv-speculators" / "bin" / "python"
    if python.is_file():
        return Finding("speculators", "ok", f"{python} (for the slow tests)")
    return Finding("speculators", "warn", "no .venv-speculators (only the slow tests use it)", "run `make setup-speculators`")


def cpu(facts: dict) -> List[Finding]:
    from blockdraft.demo import CPU_NAMES, cpu_class, sized_for
    from blockdraft.machine import describe

    name = cpu_class(facts)
    return [Finding("cpu", "ok", f"{describe(facts)}; class {name}: {CPU_NAMES[name]}"),
            Finding("demo preset", "ok", " ".join(sized_for(facts)))]


def gpu(facts: dict) -> List[Finding]:
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        found = Finding("gpu", "ok", f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    elif facts.get("gpu"):
        found = Finding("gpu", "warn", f"nvidia-smi sees {facts['gpu']}, but torch {torch.__version__} has no CUDA",
                        "rebuild the training environment here: `rm -rf .venv` then run `make setup`")
    else:
        found = Finding("gpu", "warn", "none: training and vLLM run on the CPU")
    if torch.distributed.is_available() and torch.distributed.is_nccl_available():
        return [found, Finding("nccl", "ok", "available: GPU ranks talk over nccl")]
    return [found, Finding("nccl", "warn", "not available: ranks use gloo" + ("; GPU ranks need nccl" if cuda else
                                                                              " (all that CPU ranks need)"))]


def caches() -> List[Finding]:
    from huggingface_hub import constants

    found = [Finding(name, "ok", f"{path} ({'present' if path.exists() else 'not written yet'})")
             for name, path in cache_locations().items()]
    value = os.environ.get("HF_HUB_OFFLINE")
    if constants.HF_HUB_OFFLINE:
        return found + [Finding("hf offline", "ok", f"HF_HUB_OFFLINE={value}: nothing is fetched from the Hub")]
    return found + [Finding("hf offline", "warn", f"HF_HUB_OFFLINE={value}: a missing file may be fetched from the Hub",
                            "unset HF_HUB_OFFLINE (blockdraft then runs offline)")]


def targets() -> List[Finding]:
    from blockdraft.demo import TARGET_DIR
    from blockdraft.models.prepare_gguf import is_prepared

    demo = REPO_ROOT / TARGET_DIR
    tiny = (Finding("tiny target", "ok", f"{TINY_TARGET}") if (TINY_TARGET / "config.json").is_file() else
            Finding("tiny target", "warn", f"absent: {TINY_TARGET} (the tests' target)", TINY_FIX))
    return [tiny, Finding("demo target", "ok", str(demo)) if is_prepared(demo) else
            Finding("demo target", "warn", f"absent: {demo}", "run `make demo` (or `python -m blockdraft.models.prepare_gguf`)")]


def demo_data() -> Finding:
    from blockdraft.data.sharegpt import sharegpt_path
    from blockdraft.models.prepare_gguf import find_gguf

    try:
        gguf, sharegpt = find_gguf(), sharegpt_path()
    except (ConfigError, DataError) as err:
        return Finding("demo data", "warn", str(err))
    if not sharegpt.is_file():
        return Finding("demo data", "warn", f"no ShareGPT file at {sharegpt}", "run `make setup`")
    return Finding("demo data", "ok", f"{gguf.name}, {sharegpt.name}")


def findings(settings: DoctorSettings) -> List[Finding]:
    from blockdraft.machine import machine_facts

    facts = machine_facts()
    python = Path(settings.vllm_python).expanduser() if settings.vllm_python else DEFAULT_VLLM_PYTHON
    training = training_torch()
    devices = gpu(facts) if training.status == "ok" else []  # they ask torch
    return [python_version(), training, *serving_env(python), speculators_env(), *cpu(facts), *devices, *caches(),
            *targets(), demo_data()]


def parse_arguments(argv: List[str]) -> DoctorSettings:
    values = {}
    for word in argv:
        key, sep, value = word.partition("=")
        if not sep or key not in DoctorSettings.__dataclass_fields__:
            raise ConfigError(f"{word!r}: doctor takes only vllm_python=<path>.")
        values[key] = value or None
    return DoctorSettings(**values)


def usage() -> str:
    from blockdraft.config.key_table import key_rows, render_rows

    return f"{__doc__.strip()}\n\nkeys:\n{render_rows(key_rows(DoctorSettings, DoctorSettings()))}"


def main(argv: List[str]) -> int:
    from blockdraft.config.cfg_flag import front_door

    done, settings = front_door(argv, usage, parse_arguments, lambda s: f"vllm_python: {s.vllm_python or 'null'}",
                                "the settings doctor would use")
    if done is not None:
        return done
    found = findings(settings)
    for finding in found:
        print(finding.line())
    missing = [f.name for f in found if f.status == "missing"]
    print(f"\n{len(missing)} missing: {', '.join(missing)}" if missing else "\neverything the CPU product needs is in place")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
