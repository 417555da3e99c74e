"""The Python packages scripts/gpu_check.sh carries to a bare CUDA machine (scripts/gpu_wheels.toml).

    python scripts/gpu_wheels.py check [--wheels DIR]  # the list resolves (dry run; CPU, offline)
    python scripts/gpu_wheels.py fetch DIR             # download the wheels for CPython 3.12 / x86_64
    python scripts/gpu_wheels.py verify                # on the GPU machine, after installing them
    python scripts/gpu_wheels.py imports               # the GPU steps import nothing optional

`check` reads each carried package's requirements from the metadata installed here (the pins are
this environment's versions), evaluated for Python 3.12 on Linux, and fails on any requirement that
is neither carried at a version that satisfies it nor listed as present, assumed or optional.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LIST = Path(__file__).with_suffix(".toml")
# The GPU machine's interpreter: markers are evaluated for it, wheels fetched for it.
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
# Modules the GPU steps import (training, capture, the CUDA tests' helpers, the --serve gate); none may
# need an optional package.
GPU_STEP_MODULES = ["blockdraft.train.__main__", "blockdraft.train.loop", "blockdraft.capture.stage",
                    "blockdraft.train.validation", "blockdraft.export.__main__", "blockdraft.gate",
                    "blockdraft.serve.harness", "blockdraft.serve.preflight"]


def load_list(path: Path = LIST) -> dict:
    data = tomllib.loads(path.read_text())
    return {
        "carry": {canonicalize_name(k): v for k, v in data["carry"].items()},
        "present": {canonicalize_name(n) for n in data["present"]["names"]},
        "assumed": {canonicalize_name(n) for n in data["assumed"]["names"]},
        "optional": {canonicalize_name(n) for n in data["optional"]},
    }


def applicable(requirement: Requirement) -> bool:
    """A requirement of the plain install (no extras) on the GPU machine's Python."""
    return requirement.marker is None or requirement.marker.evaluate(TARGET_ENV)


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dev = [r for r in project["optional-dependencies"]["dev"] if r.startswith("pytest")]
    return [Requirement(r) for r in project["dependencies"] + dev]


def check(wheels: Path | None, path: Path = LIST) -> list[str]:
    pkgs = load_list(path)
    carry, known = pkgs["carry"], pkgs["present"] | pkgs["assumed"] | pkgs["optional"]
    problems = []
    overlap = set(carry) & known
    if overlap:
        problems.append(f"{sorted(overlap)} are both carried and listed as present/assumed/optional")
    for name, pin in carry.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}=={pin} is carried but not installed here, so its requirements cannot be read")
            continue
        if Version(installed) != Version(pin):
            problems.append(f"{name}=={pin} is carried, but the tests here run {name} {installed}: pin {installed}")
        for raw in metadata.requires(name) or []:
            req = Requirement(raw)
            if not applicable(req):
                continue
            dep = canonicalize_name(req.name)
            if dep in carry:
                if not req.specifier.contains(carry[dep], prereleases=True):
                    problems.append(f"{name} needs {req}, but {dep}=={carry[dep]} is carried")
            elif dep not in known:
                problems.append(f"{name} needs {req}: carry it, or list it as present on the GPU machine")
    for req in project_requirements():
        dep = canonicalize_name(req.name)
        if dep in carry and not req.specifier.contains(carry[dep], prereleases=True):
            problems.append(f"pyproject.toml asks for {req}, but {dep}=={carry[dep]} is carried")
        elif dep not in carry and dep not in known:
            problems.append(f"pyproject.toml's {req} is neither carried nor listed as present or optional")
    if wheels is not None:
        problems += check_wheels(wheels, carry)
    return problems


WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def check_wheels(directory: Path, carry: dict) -> list[str]:
    """One wheel per pin, at the pinned version, installable on CPython 3.12 / manylinux x86_64."""
    problems, found = [], {}
    for wheel in sorted(directory.glob("*.whl")):
        m = WHEEL_NAME.match(wheel.name)
        if not m:
            problems.append(f"{wheel.name}: not a wheel file name")
            continue
        name = canonicalize_name(m["name"])
        if name in found:
            problems.append(f"two wheels of {name} ({found[name]}, {wheel.name}): keep one, or pip installs neither")
        found[name] = wheel.name
        if name not in carry:
            problems.append(f"{wheel.name} is not in the carry list")
        elif Version(m["version"]) != Version(carry[name]):
            problems.append(f"{wheel.name}: the list pins {name}=={carry[name]}")
        pys, plats = m["py"].split("."), m["plat"].split(".")
        if not any(p in ("py3", "cp312", "py312") for p in pys) or m["abi"] not in ("none", "abi3", "cp312"):
            problems.append(f"{wheel.name}: not for CPython 3.12")
        if not any(p == "any" or (p.startswith("manylinux") and p.endswith("x86_64")) for p in plats):
            problems.append(f"{wheel.name}: not for manylinux x86_64")
    problems += [f"no wheel of {name}=={pin} in {directory}: run `python scripts/gpu_wheels.py fetch {directory}`"
                 for name, pin in carry.items() if name not in found]
    return problems


def fetch(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.whl"):
        old.unlink()
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    for name, pin in load_list()["carry"].items():
        spec = f"{name}=={pin}"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *platform_args, "-d", str(directory), spec]
        if subprocess.run(cmd).returncode != 0:
            # No wheel on the index (antlr4-python3-runtime is an sdist): build the pure-Python one here.
            print(f"[wheels] no binary of {spec}: building its wheel", flush=True)
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(directory), spec])
            if built.returncode != 0:
                print(f"[wheels] could not fetch or build {spec}", file=sys.stderr)
                return 1
    problems = check_wheels(directory, load_list()["carry"])
    for p in problems:
        print(f"[wheels] {p}", file=sys.stderr)
    size = sum(w.stat().st_size for w in directory.glob("*.whl")) / 2**20
    print(f"[wheels] {len(list(directory.glob('*.whl')))} wheels, {size:.1f} MiB in {directory}", flush=True)
    return 1 if problems else 0


def verify() -> int:
    """On the GPU machine: every carried package imports at its pin; what is assumed is reported."""
    pkgs, bad = load_list(), 0
    for name in sorted(pkgs["carry"]) + sorted(pkgs["present"] | pkgs["assumed"]):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = None
        carried = name in pkgs["carry"]
        status = "ok"
        if carried and version != pkgs["carry"][name]:
            status, bad = f"expected {pkgs['carry'][name]}", bad + 1
        elif version is None:
            status = "missing (assumed: only datasets needs it)" if name in pkgs["assumed"] else "missing"
            bad += name in pkgs["present"]
        print(f"{'carried' if carried else 'machine'}\t{name}\t{version or '-'}\t{status}")
    for name in sorted(pkgs["carry"]):
        for raw in metadata.requires(name) or []:
            req = Requirement(raw)
            if not applicable(req):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                have = None
            if have is None or not req.specifier.contains(have, prereleases=True):
                print(f"unmet\t{name} needs {req}\thave {have or 'nothing'}")
    return 1 if bad else 0


def imports() -> int:
    """Import the GPU steps' modules with the optional packages made unimportable."""
    for name in load_list()["optional"]:
        sys.modules[name.replace("-", "_")] = None  # `import wandb` now raises ImportError
    sys.path.insert(0, str(REPO))
    import importlib

    for module in GPU_STEP_MODULES:
        importlib.import_module(module)
    print(f"[imports] {len(GPU_STEP_MODULES)} modules import without {sorted(load_list()['optional'])}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check")
    p_check.add_argument("--wheels", type=Path, help="also check the fetched wheels in this directory")
    sub.add_parser("fetch").add_argument("directory", type=Path)
    sub.add_parser("verify")
    sub.add_parser("imports")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        return fetch(args.directory)
    if args.command == "verify":
        return verify()
    if args.command == "imports":
        return imports()
    problems = check(args.wheels)
    for p in problems:
        print(f"[wheels] {p}", file=sys.stderr)
    if not problems:
        print(f"[wheels] {len(load_list()['carry'])} carried packages resolve against pyproject.toml and each other")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
