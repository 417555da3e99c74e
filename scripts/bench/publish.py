"""What every benchmark here shares: how a figure says what measured it (the command, the machine
kind, the date) and where it goes (the script's own section of docs/benchmarks-history.md).

    from publish import REPO, command_line, provenance, publish, shown_path, stamp

A benchmark runs as `python scripts/bench/<name>.py`, so this folder is first on sys.path and the
import finds this file. Standard library only at import: the GPU check and the serving
interpreter import it too.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The serving interpreter (.venv-serve) does not install blockdraft, and a bare GPU machine may not
# either: the machine kind and the scripts' own imports then come from this checkout.
if importlib.util.find_spec("blockdraft") is None:
    sys.path.append(str(REPO))

DOC = REPO / "docs" / "benchmarks-history.md"
FIGURES = REPO / "docs" / "benchmarks"
DOC_HEADER = (
    "# Benchmarks\n\nEvery figure here comes from a script in `scripts/bench/` that rewrites its own section; "
    "rerun it to refresh the section. Timings on a shared 2-core machine vary by tens of percent from run to run.\n"
)


def machine_kind() -> str:
    """E.g. "2-core x86_64 CPU (AMD EPYC; no avx512f, avx512_bf16, amx), 24 GiB, no GPU": the CPU model and
    the ISA features that change kernels, since machines of one kind differ in both."""
    from blockdraft.machine import describe

    return describe()


def today() -> str:
    """The date as `date` prints it: what the section says it was measured on."""
    return subprocess.run(["date"], capture_output=True, text=True).stdout.strip()


def stamp() -> str:
    """The machine and the date, for a benchmark that prints its figures instead of writing a section."""
    return f"{machine_kind()}; {today()}"


def command_line(python: str = ".venv/bin/python", env: str = "") -> str:
    """The invocation as a shell would take it back (arguments with spaces are quoted); `env` is
    prefixed as written, e.g. "OMP_WAIT_POLICY=PASSIVE"."""
    script = str(Path(sys.argv[0]).relative_to(REPO) if Path(sys.argv[0]).is_absolute() else sys.argv[0])
    return (f"{env} " if env else "") + shlex.join([python, script, *sys.argv[1:]])


def provenance(command: str) -> str:
    return f"Command: `{command}`  \nMachine: {machine_kind()}  \nDate: {today()}\n"


def shown_path(path) -> Path:
    """A path as a section shows it: relative to the repository when inside it, so no machine's checkout appears."""
    resolved = Path(path).resolve()
    return resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved


def write_section(key: str, title: str, body: str, doc: Path = DOC) -> Path:
    """Replace (or append) the section between `<!-- bench:key -->` markers; other sections stay."""
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{start}\n## {title}\n\n{body.rstrip()}\n{end}\n"
    text = doc.read_text() if doc.is_file() else DOC_HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return doc


def publish(key: str, title: str, body: str, doc: Path = DOC) -> Path:
    """Write the section, and print it and where it went: the run's log holds what the page says."""
    path = write_section(key, title, body, doc)
    print(body)
    print(f"written to {path}")
    return path
