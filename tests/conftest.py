import pytest
import torch

from blockdraft.models import build_draft
from blockdraft.models.resolve import DraftConfig, resolve_draft_config
from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import build_tiny_model

MASK_ID = 262  # <|reserved_2|> of the tiny tokenizer: never pad, eos or bos

# Every model the tests build in this process is tiny: a second OpenMP thread only adds wake-up
# latency to each op (a sampled tiny decode measured 17 ms with two threads, 15 ms with one; 40 ms
# with two under OMP_WAIT_POLICY=PASSIVE), and leaves a core to the vLLM servers tests start.
# Subprocesses (training runs, torchrun, vLLM) set their own thread counts.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory):
    """The machine-wide records (the round costs a probe measured) go to a folder of this test run: a test
    never reads a figure a real pipeline measured here, nor leaves one behind."""
    import os

    path = tmp_path_factory.mktemp("blockdraft_cache")
    before = os.environ.get("BLOCKDRAFT_CACHE_DIR")
    os.environ["BLOCKDRAFT_CACHE_DIR"] = str(path)
    yield path
    if before is None:
        os.environ.pop("BLOCKDRAFT_CACHE_DIR", None)
    else:
        os.environ["BLOCKDRAFT_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def tiny_hf():
    return build_tiny_model("qwen3", seed=0)


def make_draft(hf_model, kind="dflash", seed=1, **overrides):
    settings = dict(kind=kind, num_layers=2, block_size=4, mask_token_id=MASK_ID, target_layer_ids=[1, 3], conv_group_size=8)
    settings.update(overrides)
    cfg = resolve_draft_config(DraftConfig(**settings), hf_model.config)
    torch.manual_seed(seed)
    return build_draft(cfg)


@pytest.fixture
def tiny_target(tiny_hf):
    return TargetModel(tiny_hf, [1, 3])
