"""Each draft kind's rules, as docs/export.md and docs/training.md quote them, are the code's: the
architecture an export writes, the num_speculative_tokens a round drafts, what serves it (vLLM's V1 or
V2 runner, or the reference engine), the names the importer reads, and the references the model card
prints. The tests read both sides."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

import pytest

from blockdraft.export.references import reference_lines
from blockdraft import kinds
from blockdraft.kinds.registry import architectures

# The kinds the docs describe: the built-in ones (a kind a test registers, such as the conformance suite's toy
# kind, is not the product's).
DRAFT_KINDS = kinds.registry.BUILTIN

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section(page: str, heading: str) -> str:
    """The text under `heading` up to the next heading of its level or above."""
    text = (DOCS / page).read_text()
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1:]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, flags=re.M)]
    return rest[:ends[0]] if ends else rest


def table_rows(text: str) -> List[Dict[str, str]]:
    """The first markdown table in `text`, as dicts keyed by its header cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    header = cells[0]
    return [dict(zip(header, row)) for row in cells[2:]]


def first_code(cell: str) -> str:
    return re.search(r"`([^`]+)`", cell).group(1)


def deploy_table() -> Dict[str, Dict[str, str]]:
    return {first_code(row["kind"]): row for row in table_rows(section("export.md", "## The deploy line"))}


def test_the_deploy_table_has_every_kind():
    assert set(deploy_table()) == set(DRAFT_KINDS)


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_each_kinds_architecture_is_the_one_export_writes(kind):
    assert first_code(deploy_table()[kind]["`architectures`"]) == kinds.get(kind).architecture


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_each_kinds_num_speculative_tokens_is_the_rule_the_code_applies(kind):
    cell = deploy_table()[kind]['`"num_speculative_tokens"`']
    quoted = re.findall(r"`(block_size(?: - 1)?)`", cell)
    block = 8  # any block size tells the two rules apart
    value = {"block_size": block, "block_size - 1": block - 1}
    assert value[quoted[0]] == kinds.get(kind).drafted_per_round(block, {"sample_from_anchor": True})
    if len(quoted) > 1:  # the other layout, quoted "with `sample_from_anchor: false`"
        assert "sample_from_anchor: false" in cell
        assert value[quoted[1]] == kinds.get(kind).drafted_per_round(block, {"sample_from_anchor": False})
    else:
        spec = kinds.get(kind)
        assert spec.drafted_per_round(block, {"sample_from_anchor": True}) == spec.drafted_per_round(block, {"sample_from_anchor": False})


def test_the_importer_section_names_every_architecture_it_reads():
    text = section("export.md", "## Importing other stacks' drafts")
    missing = [name for name in architectures() if f"`{name}`" not in text]
    assert not missing, missing


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_training_md_cites_what_the_model_card_cites(kind):
    references = section("training.md", "### References")
    lines = reference_lines(kind)
    assert lines, f"{kind} has no references in blockdraft/export/references.py"
    start = references.index(f"(`{kind}`)\n")
    assert references[start:].split("\n\n", 2)[1].splitlines() == lines


def serving_rule(kind: str) -> str:
    """What serves a kind, as its registry entry says: reference | vllm (V1 or V2) | vllm V2 only."""
    spec = kinds.get(kind)
    if spec.reference_only:
        return "reference"
    if spec.v2_runner:
        return "v2"
    assert spec.vllm_method, f"{kind}: its registry entry states no rule for it"
    return "vllm"


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_what_serves_each_kind_is_what_preflight_decides(kind):
    runner = deploy_table()[kind]["model runner"]
    kinds_table = {first_code(row["`draft.kind`"]): row for row in table_rows(section("training.md", "## Draft kinds"))}
    serves = kinds_table[kind]["what serves it"]
    rule = serving_rule(kind)
    if rule == "reference":
        assert "reference engine only" in serves and "no vLLM line" in deploy_table()[kind]["before `vllm serve`"]
    elif rule == "v2":
        assert runner.startswith("V2 only") and "V2" in serves and "elsewhere the reference engine" in serves
    else:
        assert runner.startswith("V1 or V2") and "V2" not in serves and "reference engine" not in serves


def test_the_stage_order_said_is_the_order_the_pipeline_runs():
    """`blockdraft --help` and docs/pipeline.md's table name the stages in the pipeline's own order (the gate
    first: test_pipeline_gate_first.py shows it runs before regen)."""
    from blockdraft.cli import COMMANDS
    from blockdraft.pipeline.settings import STAGES

    chain = " -> ".join(STAGES)
    assert STAGES[:2] == ("gate", "regen")
    assert COMMANDS["pipeline"][1].startswith(chain)
    row = next(line for line in (DOCS / "pipeline.md").read_text().splitlines()
               if line.startswith("| `pipeline` |"))
    assert chain in row
