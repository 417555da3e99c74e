"""Outputs are never deleted or overwritten without overwrite=true; damaged exports are named;
paths from configs reach vLLM as argv words, never through a shell."""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest

from blockdraft.draft_format.importer import import_draft
from blockdraft.errors import ConfigError, DataError
from blockdraft.export.writer import export_draft
from blockdraft.vllm_runtime.server import VllmServer
from tests.fake_vllm import write_fake_python
from tests.faults.conftest import MAX_STEPS, REPO
from tests.integration.conftest import train_tiny


def tree(path: Path) -> dict:
    """{relative path: sha256} of every file under `path` (or of `path` itself if a file)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)) if p != path else ".": hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def changed(before: dict, after: dict) -> list:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def test_a_run_dir_holding_a_run_is_kept_without_overwrite(rep, tmp_path, reference_run, record):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    (run_dir / "notes.txt").write_text("the user's own file\n")
    before = tree(run_dir)
    began = time.monotonic()
    with pytest.raises(ConfigError, match="resume=auto, pick another run_dir, or pass overwrite=true") as refused:
        train_tiny(run_dir, "train.max_steps=2", "data.val=null")
    seconds = time.monotonic() - began
    problems = [f"files changed by a refused run: {changed(before, tree(run_dir))}"] if changed(before, tree(run_dir)) else []
    train_tiny(run_dir, "train.max_steps=2", "data.val=null", "overwrite=true")
    after = tree(run_dir)
    if after.get("notes.txt") != before["notes.txt"]:
        problems.append("overwrite=true deleted a file that is not the run's (notes.txt)")
    if any(k.startswith(f"checkpoints/step_{MAX_STEPS}/") for k in after):
        problems.append("overwrite=true kept the old run's checkpoints next to the new ones")
    record("a new run into a run_dir holding a run", f"all {len(before)} files byte-identical; overwrite=true replaced only "
           "metrics.jsonl and checkpoints/ (a user file kept)", problems, seconds, "refused with the fix named: "
           + str(refused.value).split(";")[-1].strip())
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def checkpoint(reference_run):
    return reference_run / "checkpoints" / f"step_{MAX_STEPS}"


@pytest.mark.parametrize("occupant", ["a directory with a file", "a file"])
def test_an_export_never_replaces_what_is_at_out(occupant, rep, tmp_path, checkpoint, record):
    out = tmp_path / "out"
    if occupant == "a file":
        out.write_text("not an export\n")
    else:
        out.mkdir()
        (out / "keep.txt").write_text("the user's own file\n")
    before = tree(out)
    began = time.monotonic()
    with pytest.raises(ConfigError, match="overwrite=true" if occupant != "a file" else "is a file") as refused:
        export_draft(checkpoint, out, dtype="float32")
    seconds = time.monotonic() - began
    problems = [f"{out} changed: {changed(before, tree(out))}"] if changed(before, tree(out)) else []
    litter = sorted(p.name for p in tmp_path.iterdir() if p.name != "out")
    if litter:
        problems.append(f"a refused export left {litter}")
    if occupant != "a file":
        # overwrite=true replaces an export only: a directory of anything else is refused too, nothing deleted.
        with pytest.raises(ConfigError, match="holds files no export wrote"):
            export_draft(checkpoint, out, dtype="float32", overwrite=True)
        if changed(before, tree(out)):
            problems.append(f"overwrite=true changed a directory no export wrote: {changed(before, tree(out))}")
        exported = tmp_path / "exported"
        export_draft(checkpoint, exported, dtype="float32")
        export_draft(checkpoint, exported, dtype="float32", overwrite=True)
        import_draft(exported)  # an export replaced by one that is whole and verifies
    record(f"an export into {occupant}", f"{out.name} byte-identical; nothing written beside it"
           + ("; overwrite=true refused there too (no blockdraft_export.json), and replaced an earlier export with "
              "a verified one" if occupant != "a file" else ""),
           problems, seconds, "refused before writing: " + str(refused.value).split(";")[-1].strip())
    assert not problems, "\n".join(problems)


DAMAGE = {
    "a flipped bit in exported weights": lambda data: data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1:],
    "exported weights cut short (a torn copy)": lambda data: data[: len(data) * 2 // 3],
}


@pytest.mark.parametrize("fault", list(DAMAGE), ids=["bit-flip", "truncated"])
def test_a_damaged_export_is_named_when_loaded(fault, rep, tmp_path, checkpoint, record):
    out = export_draft(checkpoint, tmp_path / "out", dtype="float32")
    weights = out / "model.safetensors"
    weights.write_bytes(DAMAGE[fault](weights.read_bytes()))
    began = time.monotonic()
    problems = []
    try:
        import_draft(out)
        problems.append("the damaged export loaded without a word")
    except DataError as err:
        if f"{weights} is corrupt" not in str(err):
            problems.append(f"the error does not name the file: {err}")
    seconds = time.monotonic() - began
    record(fault, "refused at load naming model.safetensors (checksums.json); the checkpoint re-exports it", problems,
           seconds, "re-export from the checkpoint")
    assert not problems, "\n".join(problems)


HOSTILE = "odd dir; touch PWNED1 && $(touch PWNED2) `touch PWNED3` 'q\" | cat"


def test_paths_reach_vllm_as_argv_words_never_through_a_shell(rep, tmp_path, monkeypatch, record):
    monkeypatch.chdir(tmp_path)  # where a shell would have created PWNED*
    script = write_fake_python(tmp_path / "python")
    model, draft = tmp_path / HOSTILE / "target", tmp_path / HOSTILE / "draft"
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    began = time.monotonic()
    with VllmServer(script, str(model), log_path=tmp_path / HOSTILE / "vllm.log", speculative_config={"model": str(draft)},
                    args=["--max-model-len", "64"], startup_timeout_s=60):
        pass
    seconds = time.monotonic() - began
    argv = json.loads((tmp_path / "argv").read_text().splitlines()[-1])
    problems = []
    if argv[argv.index("--model") + 1] != str(model) or json.loads(argv[argv.index("--speculative-config") + 1])["model"] != str(draft):
        problems.append(f"the paths did not arrive as single argv words: {argv}")
    if list(tmp_path.glob("PWNED*")):
        problems.append("a shell ran the configured path")
    problems += [f"{where} goes through a shell" for where in shell_uses(REPO / "blockdraft")]
    record("shell metacharacters in configured paths", "paths arrived verbatim as single argv words; no shell use in blockdraft/",
           problems, seconds, "none needed: vLLM starts from an argument list")
    assert not problems, "\n".join(problems)


def shell_uses(package: Path) -> list:
    """Calls that hand a string to a shell: shell=True, os.system, os.popen, a str command to subprocess."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            name = f"{owner}.{node.func.attr}"
            shell = any(k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False) for k in node.keywords)
            string_cmd = owner == "subprocess" and node.args and isinstance(node.args[0], (ast.JoinedStr, ast.Constant, ast.BinOp))
            if shell or name in ("os.system", "os.popen") or string_cmd:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno} {name}")
    return found
