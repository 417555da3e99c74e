"""The data flow stays one way. The pipeline's stages, in the order data flows through them (regen < capture <
train < export < serve < gate < eval < pipeline), each import only the stages before it; every other module
under blockdraft/ (models/, data/, kinds/, config/, ranks/, losses/, engine/, draft_format/, vllm_runtime/,
errors.py ...) is shared, below every stage, and imports none; the pipeline is imported only by the apps that
drive it all (blockdraft/cli.py, demo.py, demo_budget.py, doctor.py). Imports are read as scripts/import_graph.py reads
them: module-level and inside functions alike (a wall crossed inside a function is still crossed), the
TYPE_CHECKING ones too. Also: `data/` and `vllm_runtime/` never import `serve/`."""

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "blockdraft"


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GRAPH = _import_graph()


def package_imports() -> list:
    """(importing module, imported module) for every import of the package's own modules, each once."""
    files = GRAPH.sources(None)
    modules = {GRAPH.module_of(path): path for path in files}
    edges = set()
    for module, path in modules.items():
        for name, _in_function in GRAPH.imports(files[path], module, path.endswith("__init__.py")):
            target = GRAPH.resolve(name, set(modules))
            if target and target != module and not module.startswith(target + "."):  # not its own package
                edges.add((module, target))
    return sorted(edges)


def _stage(module: str) -> str:
    """The stage a module belongs to, or "" for a shared one."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in GRAPH.STAGES else ""


def test_a_stage_imports_only_the_stages_before_it():
    order = GRAPH.STAGES
    offenders = [f"{m} -> {t}" for m, t in package_imports()
                 if _stage(m) and _stage(t) and order.index(_stage(t)) > order.index(_stage(m))]
    assert not offenders, f"stages reaching up the order {' < '.join(order)}: {offenders}"


def test_no_shared_module_imports_a_stage():
    offenders = [f"{m} -> {t}" for m, t in package_imports()
                 if m not in GRAPH.ABOVE and not _stage(m) and _stage(t)]
    assert not offenders, f"shared modules (below every stage) importing a stage: {offenders}"


def test_only_the_pipeline_and_the_apps_import_the_pipeline():
    assert set(GRAPH.ABOVE) == {"blockdraft.cli", "blockdraft.demo", "blockdraft.demo_budget", "blockdraft.doctor"}
    offenders = [f"{m} -> {t}" for m, t in package_imports()
                 if _stage(t) == "pipeline" and _stage(m) != "pipeline" and m not in GRAPH.ABOVE]
    assert not offenders, f"imports of blockdraft.pipeline from below it: {offenders}"


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
