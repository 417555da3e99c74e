"""A draft directory's safetensors index names its shards; a name that leads out of the directory (absolute, or
through ..) is refused before any file is opened, as a crafted index could point the importer anywhere."""

import json

import pytest

from blockdraft.draft_format.importer import INDEX_NAME, weight_files
from blockdraft.errors import ConfigError


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors"])
def test_an_index_naming_a_file_outside_the_draft_is_refused(tmp_path, name):
    draft = tmp_path / "draft"
    draft.mkdir()
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    (draft / INDEX_NAME).write_text(json.dumps({"weight_map": {"a.weight": name}}))
    with pytest.raises(ConfigError, match="names weight files outside"):
        weight_files(draft)


def test_shards_within_the_draft_are_read(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("model-00001-of-00002.safetensors", "sub/model-00002-of-00002.safetensors"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                  "b": "sub/model-00002-of-00002.safetensors"}}))
    assert [p.name for p in weight_files(tmp_path)] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
