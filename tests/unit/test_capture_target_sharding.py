"""The capture reads distributed.target_sharding and target_mesh as training does: a value it cannot apply is
refused, with the fix, before anything loads."""

import pytest

from blockdraft.capture.config import CaptureAppConfig, check_capture_config
from blockdraft.errors import ConfigError


def config(**distributed) -> CaptureAppConfig:
    cfg = CaptureAppConfig(out="unused")
    cfg.target.path, cfg.data.train = "unused-target", "unused.jsonl"
    for key, value in distributed.items():
        setattr(cfg.distributed, key, value)
    return cfg


@pytest.mark.parametrize("settings,said", [
    (dict(target_sharding="tp"), "distributed.target_sharding='tp'; use one of ['none', 'fsdp']"),
    (dict(target_mesh="node"), "set distributed.target_sharding=fsdp, or leave distributed.target_mesh=global"),
])
def test_a_sharding_the_capture_cannot_apply_is_refused_with_the_fix(monkeypatch, settings, said):
    monkeypatch.setattr("blockdraft.capture.config.check_target_path", lambda target: None)
    with pytest.raises(ConfigError) as refused:
        check_capture_config(config(**settings))
    assert said in str(refused.value)
