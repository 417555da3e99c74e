"""What the serving vLLM does with a reduced draft vocabulary, pinned against its own code.

vLLM 0.32's DFlash drafter (`qwen3_dflash.py`, DFlashQwen3ForCausalLM) builds its head with
`config.draft_vocab_size` rows, loads `lm_head.weight` unprefixed and `d2t` as
`draft_id_to_target_id`, and scatters the draft's logits to target ids `i + d2t[i]` in a row
of -inf. Its `compute_logits` runs here on our exported head and d2t, and must give what our
draft's `logits` gives (what training and the reference engine compute).
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.draft_format.importer import import_draft
from blockdraft.export.writer import export_draft
from blockdraft.models.io import save_draft
from tests.unit.export_helpers import make_run
from tests.integration.conftest import REPO
from tests.integration.serving_env import serving_run

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="needs the vLLM serving environment (`make setup-serve`)"),
]

# Runs in .venv-serve: vLLM's own compute_logits on a stand-in holding only what it reads.
VLLM_LOGITS = """
import inspect, json, sys
from types import SimpleNamespace
import torch
from safetensors.torch import load_file
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM as M

export, hidden_path, out_path = sys.argv[1:]
config = json.load(open(export + "/config.json"))
weights = load_file(export + "/model.safetensors")
head = SimpleNamespace(weight=weights["lm_head.weight"].float())
drafter = SimpleNamespace(
    config=SimpleNamespace(draft_vocab_size=config["draft_vocab_size"], vocab_size=config["vocab_size"]),
    logits_processor=lambda lm_head, h: h @ lm_head.weight.T,
    lm_head=head,
    draft_id_to_target_id=weights["d2t"],
)
torch.save(M.compute_logits(drafter, torch.load(hidden_path)), out_path)
source = inspect.getsource(M)
print("PINS " + json.dumps({
    "reads_draft_vocab_size": 'getattr(self.config, "draft_vocab_size"' in source,
    "renames_d2t": 'name.replace("d2t", "draft_id_to_target_id")' in source,
    "lm_head_unprefixed": 'elif "lm_head" not in name:' in source,
    "offset_mapping": "targets = base + self.draft_id_to_target_id" in source,
}))
"""


def test_vllm_computes_the_reduced_draft_logits_we_export(tmp_path):
    step_dir, trained = make_run(tmp_path / "run", kind="dflash", draft_vocab_size=24)
    vocab = torch.randperm(268, generator=torch.Generator().manual_seed(0))[:24].sort().values
    trained.set_draft_vocab(vocab, torch.randn(268, trained.config.hidden_size))  # a scattered, non-trivial d2t
    save_draft(step_dir, trained)
    export = export_draft(step_dir, tmp_path / "export", dtype="float32")
    draft, cfg = import_draft(export)
    assert json.loads((export / "config.json").read_text())["draft_vocab_size"] == 24
    assert load_file(str(export / "model.safetensors"))["d2t"].dtype == torch.int64
    hidden = torch.randn(5, cfg.hidden_size)
    torch.save(hidden, tmp_path / "hidden.pt")
    done = serving_run(["-c", VLLM_LOGITS, str(export), str(tmp_path / "hidden.pt"), str(tmp_path / "vllm.pt")],
                       cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    pins = json.loads(next(line[5:] for line in done.stdout.splitlines() if line.startswith("PINS ")))
    assert all(pins.values()), pins
    ours = draft.logits(hidden, torch.zeros(cfg.vocab_size, cfg.hidden_size))  # a reduced draft ignores the target head
    theirs = torch.load(tmp_path / "vllm.pt")
    assert theirs.shape == (5, cfg.vocab_size)
    assert torch.equal(torch.isinf(theirs), torch.isinf(ours))
    torch.testing.assert_close(theirs[~torch.isinf(theirs)], ours[~torch.isinf(ours)])
