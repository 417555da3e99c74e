"""Nothing is downloaded at run time however an app starts: importing blockdraft sets HF_HUB_OFFLINE=1
unless the environment already says otherwise, so a hub dataset id missing from the local cache is refused
at once, with the way to allow the download; HF_HUB_OFFLINE=0 is the user's explicit yes."""

import os
import subprocess
import sys

PROBE = """
import time, blockdraft
import huggingface_hub.constants as hub
from blockdraft.data.sources import check_source
from blockdraft.errors import ConfigError
print("offline", hub.HF_HUB_OFFLINE)
if hub.HF_HUB_OFFLINE:
    start = time.monotonic()
    try:
        check_source("nobody-here/no-such-rows", "data.train")
    except ConfigError as err:
        print("refused", round(time.monotonic() - start, 1), err)
"""


def probe(**env):
    clean = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    result = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_an_app_started_without_the_variable_stays_offline_and_says_how_to_download():
    out = probe()
    assert "offline True" in out
    refused = next(line for line in out.splitlines() if line.startswith("refused"))
    assert "not in the local Hugging Face cache" in refused and "HF_HUB_OFFLINE=0" in refused
    assert float(refused.split()[1]) < 20, "an offline refusal must not wait on the network"


def test_the_users_explicit_choice_wins():
    assert "offline False" in probe(HF_HUB_OFFLINE="0")


def test_the_pipelines_stages_get_the_users_choice(monkeypatch):
    """A stage reads the dataset a user allowed to download (HF_HUB_OFFLINE=0); by default it stays offline."""
    from blockdraft.pipeline.process import stage_environment

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert stage_environment()["HF_HUB_OFFLINE"] == "0"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert stage_environment()["HF_HUB_OFFLINE"] == "1"
