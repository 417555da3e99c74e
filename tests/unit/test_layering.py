"""The data flow stays one way: `data/` and `vllm_runtime/` never import `serve/`."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "blockdraft"


def imported_modules(path: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_data_and_vllm_runtime_do_not_import_serve():
    offenders = {}
    for folder in ("data", "vllm_runtime"):
        for path in sorted((PACKAGE / folder).glob("*.py")):
            bad = sorted(m for m in imported_modules(path) if m == "blockdraft.serve" or m.startswith("blockdraft.serve."))
            if bad:
                offenders[str(path.relative_to(PACKAGE))] = bad
    assert not offenders, f"imports of serve/ below it: {offenders}"


def test_vllm_runtime_imports_nothing_else_of_blockdraft():
    for path in sorted((PACKAGE / "vllm_runtime").glob("*.py")):
        inner = [m for m in imported_modules(path) if m.startswith("blockdraft") and not m.startswith("blockdraft.vllm_runtime")]
        assert not inner, f"{path.name} imports {inner}"


def test_regen_is_a_room_above_data():
    """data/ is what stages share: it never imports the regen stage (regen imports data, not the reverse),
    and regen's modules never reach into serve/, train/ or pipeline/ above them."""
    offenders = {}
    for path in sorted((PACKAGE / "data").glob("*.py")):
        bad = sorted(m for m in imported_modules(path) if m.startswith("blockdraft.regen"))
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    above = ("blockdraft.serve", "blockdraft.train", "blockdraft.pipeline", "blockdraft.export")
    for path in sorted((PACKAGE / "regen").glob("*.py")):
        bad = sorted(m for m in imported_modules(path) if m.startswith(above))
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    assert not offenders, f"imports across the regen room's walls: {offenders}"


def test_data_is_below_every_stage():
    """data/ is what the stages share (tokenising, the token file, the feature store's reader): it never imports
    capture/, train/ or pipeline/ above it; the capture room writes stores with data's formats, not the reverse."""
    above = ("blockdraft.capture", "blockdraft.train", "blockdraft.pipeline", "blockdraft.regen", "blockdraft.export")
    offenders = {}
    for path in sorted((PACKAGE / "data").glob("*.py")):
        bad = sorted(m for m in imported_modules(path) if m.startswith(above))
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    assert not offenders, f"data/ reaching up into a stage: {offenders}"
