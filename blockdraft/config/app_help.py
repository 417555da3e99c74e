"""`<app> --help` for the Hydra apps: a usage line, an example, the config groups and every key with its
type, default and meaning, generated from the app's schema (key_table) so the help cannot drift.

Hydra's own help lists keys without meaning; the apps call `exit_if_help_asked` before `hydra.main`.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import yaml

from blockdraft.config import CONFIG_DIR
from blockdraft.config.key_table import KeyRow, key_rows, render_rows

HELP_FLAGS = ("-h", "--help")

# What each config group chooses; its options are the files in configs/<group>/.
GROUP_MEANING = {
    "experiment": "a recipe: target, draft, data and training settings together",
    "target": "the frozen model the draft serves; or target=<dir>, a local Hugging Face directory",
    "draft": "the draft architecture and its defaults",
    "data": "where the chat rows come from and how they are cut",
    "optim": "the optimizer and its schedule",
    "objective": "the draft kind's own loss settings; follows draft= unless given",
}


@dataclass
class AppHelp:
    app: str
    """The config name: configs/<app>.yaml."""
    module: str
    """What `python -m` runs: the usage line names it when the app was not started as `blockdraft <command>`."""
    schema: type
    usage: str
    """The arguments after the command, e.g. `[experiment=<recipe>] [key=value ...]`."""
    example: str
    """The arguments of one working command."""
    notes: Sequence[str] = ()
    rewrite: Optional[Callable[[List[str]], List[str]]] = None
    """The app's own argument rewriting (aliases), applied before the overrides are composed for the defaults."""


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv[1:])


def program(module: str) -> str:
    """`blockdraft train` when started so (cli.RUNNING), else `python -m <module>`."""
    cli = sys.modules.get("blockdraft.cli")
    return getattr(cli, "RUNNING", None) or f"python -m {module}"


def config_groups(app: str) -> Dict[str, str]:
    """{group: default option} from configs/<app>.yaml's defaults list (hydra/ overrides left out)."""
    defaults = yaml.safe_load((CONFIG_DIR / f"{app}.yaml").read_text()).get("defaults", [])
    groups = {}
    for entry in defaults:
        if isinstance(entry, dict):
            for group, option in entry.items():
                if not group.startswith("override") and (CONFIG_DIR / group).is_dir():
                    groups[group] = "null" if option is None else str(option)
    return groups


def group_lines(app: str) -> List[str]:
    lines = []
    for group, default in config_groups(app).items():
        options = " | ".join(sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml")))
        lines.append(f"  {group}=<{options}>  (default: {default})")
        lines.append(f"      {GROUP_MEANING.get(group, 'files in configs/' + group + '/')}")
    return lines


def sections(rows: List[KeyRow]) -> Dict[str, List[KeyRow]]:
    """Rows by their first dotted part (`train.*`); top-level keys first."""
    out: Dict[str, List[KeyRow]] = {"": []}
    for row in rows:
        head, dot, _ = row.key.partition(".")
        out.setdefault(head if dot else "", []).append(row)
    return out


def composed_defaults(spec: AppHelp, overrides: List[str]):
    """The app's config composed with the given overrides (so a recipe shows its own defaults); without
    them when they do not compose, since help should not fail on the typo it would explain."""
    from blockdraft.config import compose

    words = [a for a in overrides if a not in HELP_FLAGS]
    try:
        return compose(spec.app, spec.rewrite(words) if spec.rewrite else words), words
    except Exception:
        return compose(spec.app, []), []


def render_help(spec: AppHelp, argv: Sequence[str]) -> str:
    prog = program(spec.module)
    cfg, used = composed_defaults(spec, list(argv[1:]))
    lines = [f"usage: {prog} {spec.usage}", f"example: {prog} {spec.example}", ""]
    for note in spec.notes:
        lines += textwrap.wrap(note, 100, initial_indent="  ", subsequent_indent="    ")
    groups = group_lines(spec.app)
    if groups:
        lines += ["", "config groups (group=option):", *groups]
    shown = f" (defaults as composed with: {' '.join(used)})" if used else " (defaults as composed)"
    lines += ["", f"keys: key=value on the command line{shown}"]
    for head, rows in sections(key_rows(spec.schema, cfg)).items():
        lines += ["", f"{head}.*:" if head else "top-level keys:", render_rows(rows)]
    lines += ["", f"{prog} --cfg job [key=value ...] prints the composed config without running; "
                  "--hydra-help lists Hydra's own flags."]
    return "\n".join(lines)


def exit_if_help_asked(spec: AppHelp, argv: Optional[Sequence[str]] = None) -> None:
    argv = sys.argv if argv is None else argv
    if wants_help(argv):
        print(render_help(spec, argv))
        sys.exit(0)
