"""The eval app refuses a bad setting before any model or server starts, naming the fix."""

import pytest
from omegaconf import OmegaConf

from blockdraft.config import compose, register_schema
from blockdraft.errors import ConfigError
from blockdraft.eval.config import EvalAppConfig, settle_top_k

register_schema("eval_schema", EvalAppConfig)


def _cfg(*overrides) -> EvalAppConfig:
    return OmegaConf.to_object(compose("eval", ["target_dir=/t", "drafts=[/e/a,/e/b]", "datasets=[tiny]", *overrides]))


def test_defaults_are_greedy_and_the_usual_sampled_setting():
    cfg = _cfg().validate()
    assert settle_top_k(cfg, "cuda", vllm=True) == []
    assert cfg.sampling_of("greedy").request_fields() == {"temperature": 0.0}
    assert cfg.sampling_of("sampled").request_fields() == {"temperature": 1.0, "top_p": 0.95, "top_k": 20}
    assert cfg.options("humaneval").use_chat_template is False and cfg.options("tiny").use_chat_template is True


def test_a_new_setting_and_per_dataset_options_come_from_the_command_line():
    cfg = _cfg("+sampling.hot.temperature=1.3", "settings=[greedy,hot]", "+dataset_options.tiny.max_tokens=7").validate()
    assert cfg.sampling_of("hot").request_fields() == {"temperature": 1.3, "top_p": 1.0, "top_k": -1}
    assert cfg.options("tiny").max_tokens == 7 and cfg.options("tiny").num_prompts == 16


@pytest.mark.parametrize("overrides,needle", [
    (["drafts=[]"], "at least one exported draft"),
    (["drafts=[/e/a,/f/a]"], "share a directory name"),
    (["runs=[/r]"], "runs has 1 entries for 2 drafts"),
    (["datasets=[nope]"], "neither a built-in set"),
    (["settings=[greedy,warm]"], "['warm'] not defined in sampling"),
    (["+sampling.hot.temprature=1"], "unknown key(s) ['temprature']"),
    (["+sampling.hot.top_p=0"], "0 < top_p <= 1"),
    (["concurrency=[1,1]"], "distinct values"),
    (["concurrency=[4]", "max_num_seqs=2"], "max_num_seqs=2 is below concurrency 4"),
])
def test_bad_settings_are_refused_with_the_fix(overrides, needle):
    with pytest.raises(ConfigError) as err:
        _cfg(*overrides).validate()
    assert needle in str(err.value)


def test_on_a_cpu_vllm_the_default_sampled_setting_drops_its_top_k_and_says_so():
    cfg = _cfg().validate()
    notes = settle_top_k(cfg, "cpu", vllm=True)
    assert len(notes) == 1 and "sampling.sampled" in notes[0] and "top-k 20" in notes[0]
    assert cfg.sampling_of("sampled").request_fields() == {"temperature": 1.0, "top_p": 0.95, "top_k": -1}
    reference = _cfg().validate()  # the reference engine on a CPU verifies a top-k: it keeps it
    assert settle_top_k(reference, "cpu", vllm=False) == [] and reference.spec("sampled").top_k == 20


def test_an_explicit_top_k_is_still_refused_on_a_cpu_vllm_with_the_fix():
    with pytest.raises(ConfigError, match=r"settings \['sampled'\].*sampling.sampled.top_k=0"):
        settle_top_k(_cfg("sampling.sampled.top_k=20").validate(), "cpu", vllm=True)
    assert settle_top_k(_cfg("sampling.sampled.top_k=20").validate(), "cuda", vllm=True) == []  # a GPU vLLM takes it
    assert settle_top_k(_cfg("sampling.sampled.top_k=0").validate(), "cpu", vllm=True) == []
