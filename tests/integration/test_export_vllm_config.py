"""vLLM reads our config.json as we mean it: parsed by its own config code in the serving venv.

vLLM loads a draft's config as a plain Qwen3 config and wraps it in EAGLEConfig for
method=dflash; defaults fill anything missing without a word (head_dim 128, rope_theta
10000, causal sliding layers), so the parsed values are compared with what was written.
"""

import json
from pathlib import Path

import pytest

from blockdraft.export.writer import export_draft
from tests.integration.serving_env import serving_run
from tests.unit.export_helpers import make_run

REPO = Path(__file__).resolve().parents[2]
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"

pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(
        not (REPO / ".venv-serve" / ".stamp").exists() or not SERVE_PYTHON.exists(),
        reason="needs the vLLM serving environment .venv-serve (`make setup-serve` builds it)",
    ),
]

# Runs inside .venv-serve: vLLM's get_config, the EAGLEConfig wrap for method=dflash, its
# registry, and its aux-layer resolution (which must apply the +1 to dflash_config ids).
PARSE = """
import json, sys
from types import SimpleNamespace
from vllm.model_executor.models import ModelRegistry
from vllm.transformers_utils.config import get_config
from vllm.transformers_utils.configs.eagle import EAGLEConfig
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

for path in sys.argv[1:]:
    cfg = EAGLEConfig(get_config(path, trust_remote_code=False), method="dflash", model_type="eagle")
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=cfg))
    print("PARSED " + json.dumps({
        "path": path,
        "architectures": cfg.architectures,
        "registered": all(a in ModelRegistry.get_supported_archs() for a in cfg.architectures),
        "head_dim": cfg.head_dim,
        "rope_parameters": dict(cfg.rope_parameters),
        "is_causal": getattr(cfg, "is_causal", "absent"),
        "dflash_config": getattr(cfg, "dflash_config", None),
        "sliding_window": cfg.sliding_window,
        "layer_types": list(cfg.layer_types),
        "target_hidden_size": getattr(cfg, "target_hidden_size", None),
        "aux_layers": list(get_eagle3_aux_layers_from_config(spec) or []),
    }))
"""

CASES = {
    "dflash": dict(kind="dflash"),
    "dflash2": dict(kind="dflash2"),
    "dflash_swa": dict(kind="dflash", sliding_window=8),
}


def test_vllm_parses_the_exported_configs(tmp_path):
    exports = {}
    for name, settings in CASES.items():
        make_run(tmp_path / name, **settings)
        exports[name] = export_draft(tmp_path / name, tmp_path / f"{name}-out", dtype="float32")
    done = serving_run(["-c", PARSE, *map(str, exports.values())], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    parsed = {json.loads(line[7:])["path"]: json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("PARSED ")}
    for name, out in exports.items():
        written, got = json.loads((out / "config.json").read_text()), parsed[str(out)]
        assert got["architectures"] == written["architectures"] and got["registered"], name
        assert got["head_dim"] == written["head_dim"] == 32, name
        assert got["rope_parameters"]["rope_theta"] == written["rope_theta"], name
        assert got["is_causal"] is False, name
        assert got["dflash_config"] == written["dflash_config"], name
        assert got["target_hidden_size"] == written["target_hidden_size"], name
        assert got["aux_layers"] == [i + 1 for i in written["dflash_config"]["target_layer_ids"]], name
    assert parsed[str(exports["dflash_swa"])]["sliding_window"] == 8
    assert parsed[str(exports["dflash_swa"])]["layer_types"] == ["sliding_attention"] * 2
    assert parsed[str(exports["dflash"])]["sliding_window"] is None
