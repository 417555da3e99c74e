"""The feature store: capture once, then train from it exactly as online training would."""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.errors import ConfigError
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, capture_tiny, train_tiny
from tests.integration.test_train_tiny import _launch, _train_rows

def _val(run_dir):
    return [r for r in read_metrics(run_dir) if r.get("split") == "val"][-1]


def _weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors"))


def test_training_from_a_float32_store_equals_online_training(fp32_store, tmp_path):
    args = ["train.max_steps=20", "train.log_every=5"]
    online = train_tiny(tmp_path / "online", *args)
    stored = train_tiny(tmp_path / "stored", *args, f"data.features={fp32_store}")
    pairs = list(zip(_train_rows(online), _train_rows(stored)))
    assert len(pairs) == 4
    for a, b in pairs:
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["accept_len"] == pytest.approx(a["accept_len"], rel=1e-5)
        assert b["share_target"] < 0.01 < a["share_target"]  # no target pass from the store
    assert _val(stored)["val/loss"] == pytest.approx(_val(online)["val/loss"], rel=1e-5)
    assert _val(stored)["val/accept_len"] == pytest.approx(_val(online)["val/accept_len"], rel=1e-5)
    for name, t in _weights(online, 20).items():
        torch.testing.assert_close(_weights(stored, 20)[name], t, rtol=1e-4, atol=1e-6)


def test_soft_labels_from_a_float32_store_equal_online_soft_labels(tmp_path):
    soft = ["train.kl_weight=0.5", "train.teacher_top_k=8", "train.position_weighting=dpace"]
    store = capture_tiny(tmp_path / "soft", "storage_dtype=float32", "data.val=null", *soft)
    assert json.loads((store / "index.json").read_text())["identity"]["teacher_top_k"] == 8
    args = ["train.max_steps=10", "train.log_every=5", "data.val=null", *soft]
    online = train_tiny(tmp_path / "online", *args)
    stored = train_tiny(tmp_path / "stored", *args, f"data.features={store}")
    for a, b in zip(_train_rows(online), _train_rows(stored)):
        assert a["kl"] > 0 and b["kl"] == pytest.approx(a["kl"], rel=1e-5)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for name, t in _weights(online, 10).items():
        torch.testing.assert_close(_weights(stored, 10)[name], t, rtol=1e-4, atol=1e-6)


def test_jetspec_on_the_full_distribution_trains_from_a_store_on_the_top_k_it_kept(tmp_path, capsys):
    # JetSpec's recipe asks for the full distribution; a store keeps a top-k, and both steps say so.
    store = capture_tiny(tmp_path / "jetspec", "draft=jetspec", "train.teacher_top_k=null", "data.val=null")
    assert json.loads((store / "index.json").read_text())["identity"]["teacher_top_k"] == 32
    run = train_tiny(tmp_path / "run", "draft=jetspec", "train.teacher_top_k=null", "train.max_steps=2", "data.val=null",
                     f"data.features={store}")
    out = capsys.readouterr().out
    assert "keeping its top 32" in out and "kept its top 32: training on those" in out
    assert all(r["kl"] > 0 for r in _train_rows(run))


def test_soft_labels_from_a_store_without_them_are_refused_before_training(fp32_store, tmp_path):
    with pytest.raises(ConfigError, match="kept no soft labels") as err:
        train_tiny(tmp_path / "run", f"data.features={fp32_store}", "train.kl_weight=0.5")
    assert "train.teacher_top_k=32" in str(err.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_training_from_a_float16_store_stays_within_its_rounding(tmp_path):
    store = capture_tiny(tmp_path / "fp16")  # float16 is the default
    args = ["train.max_steps=10", "train.log_every=5", "data.val=null"]
    online = train_tiny(tmp_path / "online", *args)
    stored = train_tiny(tmp_path / "stored", *args, f"data.features={store}")
    for a, b in zip(_train_rows(online), _train_rows(stored)):
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-3)


def test_training_from_a_store_never_loads_the_target_layers(fp32_store, tmp_path, monkeypatch):
    import blockdraft.train.loop as loop

    def refuse(*_a, **_k):
        raise AssertionError("the target's decoder layers were loaded")

    monkeypatch.setattr(loop, "load_causal_lm", refuse)
    monkeypatch.setattr(loop, "TargetModel", refuse)
    run = train_tiny(tmp_path / "run", "train.max_steps=3", "train.log_every=1", f"data.features={fp32_store}")
    assert len(_train_rows(run)) == 3


def test_init_from_target_from_a_store_starts_where_online_init_does(fp32_store, tmp_path, capsys):
    """From a store the copied layers come from the target's files, without building its decoder."""
    online = train_tiny(tmp_path / "online", "train.max_steps=1", "train.log_every=1", "init_from_target=true", "data.val=null")
    stored = train_tiny(tmp_path / "stored", "train.max_steps=1", "train.log_every=1", "init_from_target=true",
                        "data.val=null", f"data.features={fp32_store}")
    assert capsys.readouterr().out.count("[init] from the target: layers.0.") == 2
    torch.testing.assert_close(_train_rows(stored)[0]["loss"], _train_rows(online)[0]["loss"], rtol=1e-4, atol=1e-4)


def test_a_store_of_other_layers_or_lengths_is_refused_naming_them(fp32_store, tmp_path):
    with pytest.raises(ConfigError) as err:
        train_tiny(tmp_path / "a", f"data.features={fp32_store}", "draft.target_layer_ids=[2,4]")
    assert "target_layer_ids" in str(err.value) and "[1, 3]" in str(err.value) and "[2, 4]" in str(err.value)
    with pytest.raises(ConfigError) as err:
        train_tiny(tmp_path / "b", f"data.features={fp32_store}", "data.seq_length=128")
    assert "tokenization.seq_length: store 160 vs now 128" in str(err.value)
    for run in ("a", "b"):  # refused before any step: nothing but the run lock's directory
        assert not (tmp_path / run / "metrics.jsonl").exists() and not (tmp_path / run / "checkpoints").exists()


def test_a_run_of_the_first_rows_trains_from_a_store_of_every_row_as_online(fp32_store, tmp_path):
    """data.max_rows=N reads the store's first N rows, the N an online run would read."""
    args = ["train.max_steps=8", "train.log_every=2", "data.max_rows=4", "data.val=null"]
    online = train_tiny(tmp_path / "online", *args)
    stored = train_tiny(tmp_path / "stored", *args, f"data.features={fp32_store}")
    pairs = list(zip(_train_rows(online), _train_rows(stored)))
    assert len(pairs) == 4
    for a, b in pairs:
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_a_store_of_fewer_rows_than_the_run_asks_for_is_refused_naming_them(tmp_path):
    store = capture_tiny(tmp_path / "four", "storage_dtype=float32", "data.max_rows=4", "data.val=null")
    for asked, shown in (("null", "every row (null)"), ("6", "6")):
        with pytest.raises(ConfigError) as err:
            train_tiny(tmp_path / f"run{asked}", f"data.features={store}", f"data.max_rows={asked}", "data.val=null")
        assert f"data.max_rows: the store holds the first 4 rows, this run asks for {shown}" in str(err.value)
    run = train_tiny(tmp_path / "run4", f"data.features={store}", "data.max_rows=4", "data.val=null", "train.max_steps=2")
    assert len(_train_rows(run)) > 0


def test_a_capture_without_out_is_refused_naming_the_key():
    from blockdraft.config import compose
    from blockdraft.capture.app import run_capture

    with pytest.raises(ConfigError, match="out is not set"):
        run_capture(compose("capture", ["experiment=tiny_cpu"]))


def test_a_capture_never_mixes_into_a_store_of_other_settings(fp32_store, tmp_path):
    copy = tmp_path / "store"
    shutil.copytree(fp32_store, copy)
    with pytest.raises(ConfigError) as err:
        capture_tiny(copy, "storage_dtype=float32", "draft.target_layer_ids=[2,4]")
    assert "target_layer_ids: store [1, 3] vs now [2, 4]" in str(err.value)
    assert json.loads((copy / "index.json").read_text()) == json.loads((fp32_store / "index.json").read_text())


def test_a_split_captured_later_joins_the_store_without_redoing_the_others(fp32_store, tmp_path):
    out = tmp_path / "store"
    capture_tiny(out, "storage_dtype=float32", "data.val=null")
    train_shards = {p: p.stat().st_mtime_ns for p in (out / "train").iterdir()}
    capture_tiny(out, "storage_dtype=float32")  # now with the recipe's data.val
    index = json.loads((out / "index.json").read_text())
    assert index["splits"]["val"]["complete"]
    assert index["identity"] == json.loads((fp32_store / "index.json").read_text())["identity"]
    assert {p: p.stat().st_mtime_ns for p in (out / "train").iterdir()} == train_shards


def test_store_rows_carry_the_position_ids_training_derives(fp32_store):
    from blockdraft.data.dataset import collate
    from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset

    dataset = FeatureStoreDataset(FeatureStore.open(fp32_store), "train")
    shard = load_file(str(fp32_store / "train" / "shard-00000.safetensors"))
    n = int(shard["row_offsets"][1])
    batch = collate([dataset[0]], pad_id=0)
    assert torch.equal(batch["position_ids"][0], shard["position_ids"][:n].long())
    assert batch["features"].shape == (1, n, 2 * 64)


def test_max_rows_reads_the_first_rows_of_a_store_split(fp32_store):
    """data.max_rows means the same from a store as from a file: the first rows, in order."""
    from blockdraft.data.dataset import reply_ends
    from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset

    store = FeatureStore.open(fp32_store)
    every, first_two = FeatureStoreDataset(store, "train"), FeatureStoreDataset(store, "train", max_rows=2)
    assert len(every) > 2 and len(first_two) == 2
    assert torch.equal(first_two[1]["input_ids"], every[1]["input_ids"])
    with pytest.raises(IndexError):
        first_two[2]
    assert len(FeatureStoreDataset(store, "train", max_rows=10_000)) == len(every)
    # The draft vocabulary is chosen from those rows only.
    rows = [first_two[i] for i in range(2)]
    assert torch.equal(first_two.reply_tokens(), torch.cat([r["input_ids"][r["loss_mask"]] for r in rows]))
    ids, mask = torch.cat([r["input_ids"] for r in rows]), torch.cat([r["loss_mask"] for r in rows])
    assert torch.equal(first_two.reply_end_tokens(), reply_ends(ids, mask))
    assert torch.equal(every.reply_tokens(), torch.cat([every[i]["input_ids"][every[i]["loss_mask"]] for i in range(len(every))]))
    with pytest.raises(ConfigError, match="data.max_rows=0 must be 1 or more"):
        train_tiny(fp32_store.parent / "max-rows-0", f"data.features={fp32_store}", "data.max_rows=0")


def test_resume_and_ddp_from_a_store_train_what_one_run_trains(fp32_store, tmp_path):
    store = [f"data.features={fp32_store}", "data.val=null", "train.log_every=1", "train.micro_batch_size=2"]
    two = _launch([*store, "train.max_steps=4", "train.save_every=2", "train.keep_last=5"], tmp_path / "two", nproc=2)
    # The one-rank run in this process while the two ranks run (a third interpreter's imports would cost more).
    train_tiny(tmp_path / "one", *store, "train.max_steps=4", "train.grad_accum=2")
    out, _ = two.communicate(timeout=600)
    assert two.returncode == 0, out.decode()[-3000:]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "two" / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    train_tiny(resumed, *store, "train.max_steps=4", "train.grad_accum=2", "resume=must")
    want = {r["step"]: r["loss"] for r in _train_rows(tmp_path / "one")}
    for run in ("two", "resumed"):
        got = {r["step"]: r["loss"] for r in _train_rows(tmp_path / run)}
        for step in got:
            assert got[step] == pytest.approx(want[step], rel=1e-5)


def test_capture_reports_rejected_rows_with_their_line_numbers(tmp_path, capsys):
    rows = (REPO / ".cache" / "tiny_cpu" / "train.jsonl").read_text().splitlines()[:20]
    lines = rows[:2] + ["{not json"] + rows[2:] + ['{"messages": [{"role": "user", "content": "no reply"}]}']
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = capture_tiny(tmp_path / "store", f"data.train={data}", "data.val=null", "prepare.regenerate_builtin=null",
                       f"data.cache_dir={tmp_path / 'cache'}")
    printed = capsys.readouterr().out
    assert "22 lines read, 20 kept, 2 rejected" in printed
    assert "bad_json: 1 (lines 3)" in printed and "no_assistant_tokens: 1 (lines 22)" in printed
    report = json.loads((out / "index.json").read_text())["splits"]["train"]["report"]
    assert report["rows_kept"] == 20


def test_rows_batched_per_forward_are_the_rows_captured_one_by_one(fp32_store, tmp_path):
    """Right padding changes no earlier position: 4 rows per forward give the one-row store's rows, features
    equal within float32 noise (another batch shape takes other kernel blockings), soft labels included."""
    out = capture_tiny(tmp_path / "batched", "storage_dtype=float32", "rows_per_forward=4")
    got, want = json.loads((out / "index.json").read_text()), json.loads((fp32_store / "index.json").read_text())
    assert got["identity"] == want["identity"]  # a batch size is not part of what the store holds
    for split in ("train", "val"):
        for a, b in zip(got["splits"][split]["shards"], want["splits"][split]["shards"]):
            ta, tb = load_file(str(out / a["file"])), load_file(str(fp32_store / b["file"]))
            assert set(ta) == set(tb)
            for name in tb:
                torch.testing.assert_close(ta[name], tb[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("override,needle", [("rows_per_forward=0", "rows_per_forward=0"),
                                             ("compute_dtype=float8", "compute_dtype='float8'")])
def test_bad_capture_options_are_refused_before_the_target_loads(tmp_path, override, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        capture_tiny(tmp_path / "bad", override)
    assert not (tmp_path / "bad").exists()


def test_a_bfloat16_capture_says_so_in_its_identity_and_stays_near_the_float32_features(fp32_store, tmp_path):
    out = capture_tiny(tmp_path / "bf16", "storage_dtype=float32", "compute_dtype=bfloat16")
    identity = json.loads((out / "index.json").read_text())["identity"]
    assert identity.pop("compute_dtype") == "bfloat16"
    assert identity == json.loads((fp32_store / "index.json").read_text())["identity"]
    got = load_file(str(out / "train" / "shard-00000.safetensors"))["features"]
    want = load_file(str(fp32_store / "train" / "shard-00000.safetensors"))["features"]
    error = ((got - want).norm() / want.norm()).item()
    assert 0 < error < 0.05, error  # bfloat16's 8-bit mantissa through 4 layers: percents, not noise-free
