"""train.draft_sharding=fsdp: the draft sharded over 2 gloo ranks trains as the replicated one does, and its
checkpoints (every rank's shards, torch.distributed.checkpoint) resume on another world size, 2 ranks -> 1 -> 2,
where a save killed half way is never resumed from, and export as a whole draft."""

import contextlib
import io

import pytest
import torch
from safetensors.torch import load_file

from blockdraft import faults
from blockdraft.models.io import draft_state_dict, load_draft
from blockdraft.train.checkpoint import complete_checkpoints
from tests.integration.conftest import REPO, tiny_overrides
from tests.integration.test_train_tiny import _launch, _train_rows

# 4 rows a step: 2 ranks x 2 rows, or 1 rank x 2 rows x grad_accum 2 (the resume keeps the global batch).
ARGS = ["data.val=null", "train.log_every=1", "train.max_steps=6", "train.micro_batch_size=2", "train.save_every=2",
        "train.keep_last=5"]


def _train_here(run_dir, *args, fault=None):
    """`blockdraft train` on one process in this one (no process group); `fault`: a BLOCKDRAFT_FAULT plan."""
    from blockdraft import cli

    out = io.StringIO()
    faults._hits.clear()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        mp.chdir(REPO)
        mp.delenv(faults.ENV, raising=False)
        if fault:
            mp.setenv(faults.ENV, fault)
        code = cli.main(["train", *tiny_overrides(run_dir, *ARGS, *args)])
    return code, out.getvalue()


def _two_ranks(run_dir, *args, fault=None):
    proc = _launch([*ARGS, "train.draft_sharding=fsdp", *args], run_dir, nproc=2,
                   extra_env={faults.ENV: fault} if fault else None)
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out.decode()


def test_fsdp_checkpoints_resume_two_ranks_to_one_and_back(tmp_path):
    run = tmp_path / "sharded"
    # 2 ranks, killed after both wrote their shards of step 4 and before the rename: step_4.tmp is torn.
    code, out = _two_ranks(run, "train.grad_accum=1", fault="checkpoint.after_weights@2:kill")
    assert code != 0, out[-3000:]
    assert complete_checkpoints(run) == [run / "checkpoints" / "step_2"]
    assert sorted(p.name for p in (run / "checkpoints" / "step_4.tmp" / "draft").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    # 1 process resumes from step_2, not the torn save, and stops (a fault) once it has saved step 4.
    code, out = _train_here(run, "train.draft_sharding=fsdp", "resume=auto", fault="train.after_backward@3:raise")
    assert code == 1 and "fault injected at train.after_backward" in out and "step_2 at step 2" in out and "grad_accum 1 -> 2" in out, out[-3000:]
    assert complete_checkpoints(run)[-1].name == "step_4"
    # Back on 2 ranks from the one-process checkpoint, to the end.
    code, out = _two_ranks(run, "resume=auto")
    assert code == 0 and "step_4 at step 4" in out and "grad_accum 2 -> 1" in out, out[-3000:]

    # The uninterrupted run: the same global batch on one process, the draft replicated (ddp).
    reference = tmp_path / "reference"
    code, out = _train_here(reference, "train.grad_accum=2")
    assert code == 0, out[-3000:]
    got, want = _train_rows(run), _train_rows(reference)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6] == [r["step"] for r in want]
    for a, b in zip(got, want):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), a["step"]
    # The 2-rank sharded checkpoint read whole on this process (as export reads it) is the reference's draft.
    final = run / "checkpoints" / "step_6"
    assert not (final / "model.safetensors").exists()
    whole, ref = draft_state_dict(load_draft(final)), load_file(str(reference / "checkpoints" / "step_6" / "model.safetensors"))
    assert whole.keys() == ref.keys()
    for name, t in ref.items():
        torch.testing.assert_close(whole[name], t, rtol=1e-4, atol=1e-6)
