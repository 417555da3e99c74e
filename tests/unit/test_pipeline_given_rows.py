"""`blockdraft pipeline ... rows=<rows>`: a run started from rows the target already answered. What a user
gets wrong is refused before any work in one line with the fix; the held-out rows are apart from the
training ones by prompt content (carved out of rows=, or given and checked); the regen stage is recorded
as given, keyed by the rows' content, not their path.

The stages after regen are stand-ins here (the first of them ends the run, its command recorded): what
they do with rows is the same whatever made them (tests/integration/test_pipeline.py)."""

import json
import random

import pytest

from blockdraft.data.prompt_record import prompt_hash
from blockdraft.errors import ConfigError
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.pipeline import app, process
from blockdraft.pipeline.given_rows import inspect_given
from blockdraft.pipeline.given_split import write_given_split
from blockdraft.pipeline.runner import planned_keys
from blockdraft.pipeline.settings import parse_overrides
from blockdraft.pipeline.stages import pipeline_stages
from tests.integration.conftest import REPO

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"


@pytest.fixture(scope="module")
def target():
    return save_tiny_target(TARGET, "qwen3")


def chat(question, reply="An answer.", system=None):
    opening = [{"role": "system", "content": system}] if system else []
    return {"messages": [*opening, {"role": "user", "content": question}, {"role": "assistant", "content": reply}]}


def answered(n, repeats=0, seed=0):
    """`n` rows of distinct prompts, then `repeats` rows asking some of them again (with other replies)."""
    rows = [chat(f"Question number {i}?", f"Reply {i}.") for i in range(n)]
    rows += [chat(f"Question  number {i}?", f"Another reply {i}.") for i in random.Random(seed).sample(range(n), repeats)]
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def prompts(path):
    return {prompt_hash(r["messages"]) for r in read_jsonl(path)}


# --- the split -----------------------------------------------------------------------------------

def test_a_carved_split_holds_out_distinct_prompts_none_of_them_trained_on(tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", answered(40, repeats=15))
    account = write_given_split(str(rows), None, 8, tmp_path / "regen", print)
    train, held = tmp_path / "regen" / "train.jsonl", tmp_path / "regen" / "heldout.jsonl"
    assert len(read_jsonl(held)) == len(prompts(held)) == 8 and not prompts(train) & prompts(held)
    # Every row is on one side, or counted as a held-out prompt asked again (whitespace aside, the same prompt).
    assert account["train"] + account["heldout"] + account["heldout_repeats_set_aside"] == 55
    assert account["heldout_repeats_set_aside"] == sum(1 for r in read_jsonl(rows) if prompt_hash(r["messages"]) in prompts(held)) - 8


def test_the_carve_follows_the_prompts_not_the_row_order_or_the_file_kind(tmp_path):
    import datasets

    rows = answered(30, repeats=5)
    first = write_given_split(str(write_jsonl(tmp_path / "a.jsonl", rows)), None, 6, tmp_path / "a", print)
    shuffled = random.Random(3).sample(rows, len(rows))
    datasets.Dataset.from_list(shuffled).to_parquet(str(tmp_path / "b.parquet"))
    second = write_given_split(str(tmp_path / "b.parquet"), None, 6, tmp_path / "b", print)
    assert prompts(tmp_path / "a" / "heldout.jsonl") == prompts(tmp_path / "b" / "heldout.jsonl")
    assert (first["train"], first["heldout"]) == (second["train"], second["heldout"])


def test_given_held_out_rows_that_share_a_prompt_with_the_rows_are_refused_with_the_lines(tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", answered(20))
    held = write_jsonl(tmp_path / "held.jsonl", [chat("A new question?"), chat("Question number 4?", "Other.")])
    with pytest.raises(ConfigError, match=r"1 rows of rows=.* ask a prompt heldout_rows=.* holds \(lines 5\): drop them"):
        write_given_split(str(rows), str(held), 64, tmp_path / "regen", print)
    assert not (tmp_path / "regen" / "heldout.jsonl").exists()
    apart = write_jsonl(tmp_path / "apart.jsonl", [chat("A new question?"), chat("Another one?")])
    account = write_given_split(str(rows), str(apart), 64, tmp_path / "regen", print)
    assert account["heldout"] == 2 and account["train"] == 20 and not (tmp_path / "regen" / "train.jsonl").exists()


def test_too_few_distinct_prompts_for_the_held_out_set_is_refused(tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", [chat("Same question?", f"Reply {i}.") for i in range(10)])
    with pytest.raises(ConfigError, match="holds 1 distinct prompts .* lower regen.num_heldout="):
        write_given_split(str(rows), None, 4, tmp_path / "regen", print)


# --- before any work ----------------------------------------------------------------------------

@pytest.mark.parametrize("content,needle", [
    (None, "rows='{path}' does not exist"),
    ([{"text": "no chat"}], "none of its 1 lines is a chat row"),
    ([{"messages": [{"role": "user", "content": "Only a prompt?"}]}], "holds no assistant reply: these are prompts"),
    (answered(5), "holds 5 rows: too few to hold out regen.num_heldout=8"),
])
def test_what_a_user_gets_wrong_is_said_in_one_line_with_the_fix(tmp_path, content, needle):
    path = tmp_path / "rows.jsonl"
    if content is not None:
        write_jsonl(path, content)
    with pytest.raises(ConfigError) as err:
        inspect_given(str(path), None, 8)
    assert needle.format(path=path) in str(err.value) and "\n" not in str(err.value)


def test_the_rows_identity_is_their_content_streamed(tmp_path):
    rows = answered(12)
    one = inspect_given(str(write_jsonl(tmp_path / "a.jsonl", rows)), None, 4)
    moved = inspect_given(str(write_jsonl(tmp_path / "b.jsonl", rows)), None, 4)
    other = inspect_given(str(write_jsonl(tmp_path / "c.jsonl", rows[:-1])), None, 4)
    assert one.identity == moved.identity and one.count == 12 and other.identity["rows"]["sha256"] != one.identity["rows"]["sha256"]


def words(out, *extra):
    return [f"target={TARGET}", "experiment=tiny_cpu", f"out={out}", "round_cost=false", *extra]


@pytest.mark.parametrize("extra,needle", [
    (["heldout_rows=/h.jsonl"], "heldout_rows=/h.jsonl without rows=: add rows="),
    (["rows=/r.jsonl", "prompts=tiny"], "prompts=tiny and rows=/r.jsonl"),
    (["rows={out}/regen/train.jsonl"], "which the regen stage writes (and moves aside when its inputs change)"),
])
def test_contradicting_keys_are_refused_before_any_work(target, tmp_path, capsys, extra, needle):
    out = tmp_path / "p"
    assert app.main(words(out, *(w.format(out=out) for w in extra))) == 2
    assert needle in capsys.readouterr().err and not out.exists()


# --- the stage plan and its run -------------------------------------------------------------------

class Reached(Exception):
    pass


def test_the_pipeline_starts_from_the_given_rows_and_keeps_them_on_a_rerun(target, tmp_path, monkeypatch, capsys):
    ran = []

    def stand_in(argv, log=None):
        ran.append(argv)
        raise Reached(argv[argv.index("-m") + 1])

    monkeypatch.setattr(process, "run_command", stand_in)
    rows = write_jsonl(tmp_path / "rows.jsonl", answered(30, repeats=4))
    out = tmp_path / "run"
    with pytest.raises(Reached, match="blockdraft.capture"):  # regen is the given rows; the capture is next
        app.main(words(out, f"rows={rows}", "regen.num_heldout=6", "regen.max_tokens=9"))
    printed = capsys.readouterr().out
    assert "rows= starts from rows already answered, so no regen runs and regen.max_tokens=9 shape nothing" in printed
    account = json.loads((out / "regen" / "given.json").read_text())
    assert account["heldout"] == 6 and account["train"] + 6 + account["heldout_repeats_set_aside"] == 34
    assert f"regen: {account['train']} training rows, 6 held out, no prompt in both" in printed
    capture = ran[0]
    assert f"data.train={out / 'regen' / 'train.jsonl'}" in capture and f"data.val={out / 'regen' / 'heldout.jsonl'}" in capture
    record = json.loads((out / "stages.json").read_text())["regen"]
    assert record["done"] and not prompts(out / "regen" / "train.jsonl") & prompts(out / "regen" / "heldout.jsonl")
    with pytest.raises(Reached):
        app.main(words(out, f"rows={rows}", "regen.num_heldout=6"))
    assert "regen: cached" in capsys.readouterr().out


def planned(out, *extra):
    """(the composed configs, each stage of the chain by name, their planned keys)."""
    s = parse_overrides(words(out, *extra))
    cfgs = app.prepare(s)
    chain = pipeline_stages(s, cfgs, True, "a store")
    return cfgs, {st.name: st for st in chain}, planned_keys(chain)


def test_given_rows_are_keyed_by_content_and_trained_on_in_place_beside_their_held_out_rows(target, tmp_path):
    rows, held = answered(20), [chat("A held-out question?")]
    a, h = write_jsonl(tmp_path / "a.jsonl", rows), write_jsonl(tmp_path / "h.jsonl", held)
    cfgs, stages, base = planned(tmp_path / "run", f"rows={a}", f"heldout_rows={h}")
    assert cfgs["train"].data.train == str(a) and stages["train"].inputs["config"]["data"]["train"] == "<rows>"
    assert cfgs["serve"].prompts == str(tmp_path / "run" / "regen" / "heldout.jsonl")
    moved = write_jsonl(tmp_path / "moved.jsonl", rows)
    assert planned(tmp_path / "run", f"rows={moved}", f"heldout_rows={h}")[2] == base
    changed = write_jsonl(tmp_path / "changed.jsonl", rows[:-1])
    after = planned(tmp_path / "run", f"rows={changed}", f"heldout_rows={h}")[2]
    assert [name for name in base if after[name] == base[name]] == []
