"""The package's internal imports as figures: how many, how many inside functions, the import circles between
modules (module-level and function-level imports alike: a circle hidden inside a function is still a circle),
and the imports that reach up the pipeline's stage order. Also counts the tests of a draft kind's name outside
blockdraft/kinds/ and the package's lines.

    python scripts/import_graph.py                  # the working tree
    python scripts/import_graph.py --rev 2a934a6    # a commit, read from git without checking it out
"""

import argparse
import ast
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Set

REPO = Path(__file__).resolve().parents[1]
# The stages in the order data flows through them; each may import the ones before it, never one after.
# The apps that drive them all (the command line, the demo, the doctor) sit above; everything else under blockdraft/ is
# shared below them all.
ABOVE = ("blockdraft.cli", "blockdraft.demo", "blockdraft.demo_budget", "blockdraft.doctor")
STAGES = ("regen", "capture", "train", "export", "serve", "gate", "eval", "pipeline")
# A test of a draft kind's name: a comparison with, or a membership among, the kinds' names.
KIND_NAMES = r"(dflash|dflash2|jetspec|domino|dspark|lilicorr)"
KIND_TEST = re.compile(r"""kind\s*(==|!=|in|not in)\s*[^#\n]*?["']""" + KIND_NAMES + r"""["']""")


def sources(rev: str) -> Dict[str, str]:
    if rev is None:
        return {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "blockdraft").rglob("*.py")}
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "blockdraft"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    return {n: subprocess.run(["git", "show", f"{rev}:{n}"], cwd=REPO, check=True, capture_output=True,
                              text=True).stdout for n in names if n.endswith(".py")}


def module_of(path: str) -> str:
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(text: str, module: str, is_package: bool) -> List[tuple]:
    """(imported module, inside a function?) for every blockdraft import of a file."""
    out = []
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                inner._in_function = True
    for node in ast.walk(tree):
        inside = getattr(node, "_in_function", False)
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("blockdraft"):
                out += [(f"{base}.{a.name}", inside) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, inside) for a in node.names if a.name.startswith("blockdraft")]
    return out


def resolve(name: str, modules: Set[str]) -> str:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in STAGES:
        return parts[1]
    if parts[1:3] == ["serve", "gate"]:  # the gate's app while it lives inside serve/
        return "gate"
    return ""


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys
    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", help="a git commit (default: the working tree)")
    args = parser.parse_args()
    files = sources(args.rev)
    modules = {module_of(p): p for p in files}
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    total = inside = 0
    upward = []
    for module, path in modules.items():
        for name, in_function in imports(files[path], module, path.endswith("__init__.py")):
            target = resolve(name, set(modules))
            if not target or target == module or module.startswith(target + "."):
                continue  # a package's own __init__ on the way down is not an edge
            total += 1
            inside += in_function
            graph[module].add(target)
            mine, theirs = stage_of(module), stage_of(target)
            if module in ABOVE:
                continue
            if theirs and (not mine or STAGES.index(theirs) > STAGES.index(mine)):
                upward.append(f"{module} -> {target}")
    upward = sorted(set(upward))
    found = circles(graph)
    kind_tests = [f"{p}:{i}" for p, text in files.items() if not p.startswith("blockdraft/kinds/")
                  for i, line in enumerate(text.splitlines(), 1) if KIND_TEST.search(line)]
    lines = sum(len(t.splitlines()) for t in files.values())
    print(f"internal imports: {total}, inside functions: {inside}")
    print(f"import circles: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    print(f"imports up the stage order ({' < '.join(STAGES)}; shared modules below all): {len(upward)}")
    for edge in upward:
        print("  " + edge)
    print(f"tests of a draft kind's name outside blockdraft/kinds/: {len(kind_tests)}")
    print(f"package lines: {lines} in {len(files)} files")


if __name__ == "__main__":
    main()
