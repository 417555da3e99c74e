"""The stages in order. Each is cached when its record holds its key and its artifact is there; one
made with other inputs (or forced) is moved aside, never deleted, before the stage makes it again.

A stage's key covers its own inputs (pipeline/keys.py) and, for each stage before it, that stage's
key and which making of its artifact it read (`made`): a stage that made its artifact again makes
every later stage run again. Node 0 (or the only node) leads and writes the records; any other node
follows: it waits for node 0's records, joins the training, and stops on node 0's failure.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from blockdraft.pipeline.process import StageFailed, say
from blockdraft.pipeline.records import StageRecords, stage_key
from blockdraft.pipeline.superseded import move_aside


@dataclass
class Stage:
    name: str
    inputs: dict
    """What this stage's result depends on besides the stages before it (pipeline/keys.py)."""
    run: Callable[[], bool]
    """Runs the stage; False when it stopped short of a result worth caching."""
    present: Callable[[], bool]
    artifact: Path
    """What it makes (printed in the summary)."""
    moves: Optional[Path] = None
    """What is moved aside before the stage runs with other inputs than made it; None: never moved."""
    extent: Optional[dict] = None
    """How far it goes (training: max_steps and max_minutes, None = no limit; a bare number is a step count): a
    record of as far or further is cached; of less, continued."""
    skip_reason: Optional[str] = None
    """Set when the stage is not part of this run (online capture, no gate)."""
    joined: bool = False
    """A node of rank > 0 runs it too, beside node 0 (capture, training); other stages it only waits for."""
    resume_inputs: Optional[dict] = None
    """`inputs` less what a run that stopped part way may continue under (training: optim.lr, grad_clip)."""
    former_inputs: Optional[dict] = None
    """`inputs` as an earlier version of the stage's key held them: a record keyed so is the same making (and
    keeps its key while cached, so no later stage runs again)."""
    notes: Optional[dict] = None
    """More for its record (training: its global batch, which a run continued on another world size keeps)."""
    changed: Optional[Callable[[dict], str]] = None
    """What of its settings changed against an earlier record, said when that record's artifact is moved aside
    ('' when nothing it knows of)."""
    otherwise: Optional["Stage"] = None
    """The stage to run instead where this one would not continue its record's making (training: this one keeps
    the recorded run's global batch on another world size; `otherwise`, a new run, the recipe's)."""

    def reached_by(self, record: dict) -> bool:
        """The record's run went as far as this stage asks (always, for a stage without an extent)."""
        if self.extent is None:
            return True
        had = extent_of(record.get("extent") or 0)
        return all(at_least(had.get(limit), asked) for limit, asked in extent_of(self.extent).items())


def extent_of(value) -> dict:
    """An extent as {limit: value}; a bare number (a record from before max_minutes) is max_steps."""
    return dict(value) if isinstance(value, dict) else {"max_steps": value}


def at_least(had, asked) -> bool:
    """A limit of `had` reaches `asked`; None is no limit, which reaches any."""
    return had is None or (asked is not None and had >= asked)


def describe_extent(value) -> str:
    return ", ".join(f"{limit}={'null' if v is None else f'{v:g}'}" for limit, v in extent_of(value).items())


class NodeZeroFailed(Exception):
    """A node of rank > 0 cannot go on: node 0 failed, or did not finish within the wait."""


@dataclass(frozen=True)
class Keys:
    """A stage's keys with the stages before it: its own, the earlier version's (or None), the resume key (or None)."""
    key: str
    former: Optional[str] = None
    resume: Optional[str] = None

    def match(self, record: dict) -> bool:
        return record.get("key") is not None and record.get("key") in (self.key, self.former)


def keys_of(stage: Stage, upstream: dict) -> Keys:
    return Keys(chain_key(upstream, stage.inputs),
                chain_key(upstream, stage.former_inputs) if stage.former_inputs is not None else None,
                chain_key(upstream, stage.resume_inputs) if stage.resume_inputs is not None else None)


def resumes(stage: Stage, then: dict, keys: Keys, forced: bool) -> bool:
    """A stopped run, changed only in what its resume takes from the new config."""
    return (not forced and keys.resume is not None and not then.get("done") and then.get("resume_key") == keys.resume
            and stage.present())


def choose(stage: Stage, upstream: dict, then: dict, forced: bool) -> tuple:
    """(the form of the stage that continues its record's making, else its last `otherwise`; its keys)."""
    while True:
        keys = keys_of(stage, upstream)
        if stage.otherwise is None or (not forced and keys.match(then)) or resumes(stage, then, keys, forced):
            return stage, keys
        stage = stage.otherwise


def run_stages(stages: List[Stage], records: StageRecords, force: List[str], out: Optional[Path] = None,
               follower: bool = False, poll_s: float = 10.0, wait_s: float = 86400.0) -> Dict[str, float]:
    """Each stage in order; returns seconds per stage run here."""
    upstream: dict = {}
    spent: Dict[str, float] = {}
    began = time.time()
    for stage in stages:
        if stage.skip_reason is not None:
            upstream[stage.name] = {"skipped": True}
            say(f"{stage.name}: not run ({stage.skip_reason})")
            continue
        if follower:
            record = follow(stage, upstream, records, began, poll_s, wait_s, spent)
        else:
            stage, keys = choose(stage, upstream, records.get(stage.name), stage.name in force)
            record = lead(stage, keys, records, force, out, spent)
        # A record cached under the earlier version of its key keeps that key: the later stages' keys hold it.
        upstream[stage.name] = {"key": record.get("key"), "made": record.get("made")}
    return spent


def planned_keys(stages: List[Stage]) -> Dict[str, str]:
    """Each stage's key as a first run would compute it (no artifact made yet): what changes with what."""
    upstream, out = {}, {}
    for stage in stages:
        if stage.skip_reason is not None:
            upstream[stage.name] = {"skipped": True}
            continue
        out[stage.name] = chain_key(upstream, stage.inputs)
        upstream[stage.name] = {"key": out[stage.name], "made": None}
    return out


def chain_key(upstream: dict, inputs: dict) -> str:
    """A stage's key: its own inputs and, for each stage before it, that one's key and making."""
    return stage_key({"before": upstream, "inputs": inputs})


def lead(stage: Stage, keys: Keys, records: StageRecords, force: List[str], out: Optional[Path],
         spent: Dict[str, float]) -> dict:
    then = records.get(stage.name)
    forced = stage.name in force
    same = keys.match(then)
    if not same and resumes(stage, then, keys, forced):
        same = True
        say(f"{stage.name}: the run stopped part way; it continues from its last checkpoint under the changed "
            "settings (a finished run changed in them would be a new run)")
    if not forced and same and then.get("done") and stage.present():
        reached = then.get("extent")
        if stage.reached_by(then):
            say(f"{stage.name}: cached (finished {then['at']}, {then['seconds']:.0f} s then); skipped")
            had, asked = extent_of(reached).get("max_steps"), extent_of(stage.extent).get("max_steps") if stage.extent else None
            if had is not None and asked is not None and had > asked:
                say(f"{stage.name}: the run went to step {had}, past train.max_steps={asked}: kept as "
                    f"it is, and the later stages use its last checkpoint; to train a new {asked}-step run, "
                    f"force=[{stage.name}] (the present one is kept aside)")
            return then
        say(f"{stage.name}: the same run, {describe_extent(stage.extent)} asked where it was trained to "
            f"{describe_extent(reached)}: continuing it from its last checkpoint")
    elif stage.moves is not None and stage.moves.exists() and (forced or not same):
        why = (f"force=[{stage.name}]" if forced else "no record says what made what is there" if not then
               else settings_changed(stage, then) if then.get("inputs_key") not in own_keys(stage)
               else "a stage before it made its output again")
        move_aside(out, stage.name, stage.moves, then, why, say)
    print(f"\n[pipeline] === {stage.name} ===", flush=True)
    began = time.perf_counter()
    marks = dict(extent=stage.extent, resume_key=keys.resume, inputs_key=stage_key(stage.inputs), **(stage.notes or {}))
    records.mark(stage.name, keys.key, done=False, **marks)
    try:
        done = stage.run()
    except StageFailed as err:
        records.fail(stage.name, str(err))
        raise
    except KeyboardInterrupt:
        records.fail(stage.name, "interrupted")
        raise
    spent[stage.name] = time.perf_counter() - began
    records.mark(stage.name, keys.key, done=done, seconds=spent[stage.name], **marks)
    say(f"{stage.name}: done in {spent[stage.name]:.0f} s")
    return records.get(stage.name)


def own_keys(stage: Stage) -> tuple:
    """The stage's own inputs' hashes, as its key holds them now and held them before."""
    return tuple(stage_key(inputs) for inputs in (stage.inputs, stage.former_inputs) if inputs is not None)


def settings_changed(stage: Stage, then: dict) -> str:
    detail = stage.changed(then) if stage.changed is not None else ""
    return f"its settings changed ({detail})" if detail else "its settings changed"


def follow(stage: Stage, upstream: dict, records: StageRecords, began: float, poll_s: float, wait_s: float,
           spent: Dict[str, float]) -> dict:
    """Node 0's record of this stage, once it finished; a joined stage (capture, training) is run here as soon as
    node 0 has started it, in the form node 0 chose (`otherwise`), and then node 0's record of it finished is
    waited for too, since the next stage's key holds what it made. A failure node 0 recorded after this node
    started ends the wait; one from before is an earlier attempt, which a rerun of node 0 replaces."""
    deadline, said, joined = time.monotonic() + wait_s, 0.0, False
    while True:
        record = records.reload().get(stage.name)
        form, keys = choose(stage, upstream, record, False)
        ours = keys.match(record)
        if ours and record.get("done") and stage.reached_by(record):
            if stage.joined and not joined:
                say(f"{stage.name}: cached (node 0's record: finished {record['at']}); skipped")
            return record
        if record.get("failed") and record.get("at_epoch", 0) >= began:
            raise NodeZeroFailed(f"node 0's {stage.name} stage failed at {record['at']}: {record['failed']}. "
                                 "Fix it on node 0, then rerun the same command on every node.")
        if stage.joined and not joined and ours and not record.get("done") and not record.get("failed"):
            print(f"\n[pipeline] === {stage.name} (joining node 0) ===", flush=True)
            started = time.perf_counter()
            form.run()
            spent[stage.name] = time.perf_counter() - started
            # Node 0's ranks ended with ours: its record follows within moments.
            joined, deadline, said = True, time.monotonic() + wait_s, time.monotonic()
            continue
        if time.monotonic() > deadline:
            raise NodeZeroFailed(f"node 0 did not finish its {stage.name} stage within node_wait_minutes="
                                 f"{wait_s / 60:g}; check node 0, then rerun, or raise node_wait_minutes.")
        if time.monotonic() - said >= 60 or not said:
            said = time.monotonic()
            say(f"{stage.name}: waiting for node 0 ({time.time() - began:.0f} s)")
        time.sleep(poll_s)


def shares_line(stages: List[Stage], records: StageRecords) -> Optional[str]:
    """What the run's stages and the probe took, as each stage last ran (stages.json): the share that went to
    training, and to measuring (the probe and the serve stage)."""
    seconds = {stage.name: records.get(stage.name).get("seconds") or 0.0 for stage in stages if stage.skip_reason is None}
    probe = records.choice("round_cost") or {}
    seconds["probe"] = probe.get("seconds") or 0.0
    total = sum(seconds.values())
    if total <= 0:
        return None
    measure = seconds["probe"] + seconds.get("serve", 0.0)
    reused = " (the probe's figure read from this machine's record)" if probe.get("reused") else ""
    return (f"stages and probe {total:.0f} s: training {seconds.get('train', 0.0) / total:.0%}, measuring "
            f"(probe {seconds['probe']:.0f} s + serve {seconds.get('serve', 0.0):.0f} s) {measure / total:.0%}{reused}")


def summarize(stages: List[Stage], records: StageRecords, spent: Dict[str, float], wall: float, report: Path) -> int:
    print("\n[pipeline] ================= stages =================")
    for stage in stages:
        if stage.skip_reason is not None:
            print(f"  {stage.name:<8} not run ({stage.skip_reason})")
            continue
        then = records.get(stage.name).get("seconds") or 0.0
        note = f"{spent[stage.name]:.0f} s" if stage.name in spent else f"cached ({then:.0f} s when it ran)"
        print(f"  {stage.name:<8} {note:<28} {stage.artifact}")
    print(f"  total    {wall:.0f} s this run")
    line = shares_line(stages, records)
    if line:
        print(f"  shares   {line}")
    from blockdraft.machine import describe

    print(f"  machine  {describe()}")
    result = json.loads(report.read_text())
    print("\n[pipeline] ================= report =================")
    from blockdraft.serve.report import print_table

    print_table(result)
    from blockdraft.pipeline.deploy import print_deploy

    print_deploy(next((stage.artifact for stage in stages if stage.name == "export"), None), result)
    return 0 if result.get("passed") else 1
