"""The vLLM process, below both `data/` (regeneration, capture) and `serve/` (smoke-serve).

vLLM pins its own torch, so it lives in its own interpreter (`.venv-serve`): this package
finds that interpreter (`DEFAULT_VLLM_PYTHON`), asks it what it can do (`probe`), and starts,
health-waits and stops its OpenAI server (`server`). It imports nothing else of blockdraft.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VLLM_PYTHON = REPO_ROOT / ".venv-serve" / "bin" / "python"
