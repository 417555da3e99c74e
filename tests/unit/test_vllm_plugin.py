"""vllm_plugin/'s logic against a stand-in registry (no vLLM here): aliases added only where
missing, nothing overwritten, idempotent; the in-memory rename; the plugin's package metadata."""

import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "vllm_plugin"
sys.path.insert(0, str(PLUGIN_DIR))  # the plugin is installed in the serving env only

from blockdraft_vllm_plugin import summary  # noqa: E402
from blockdraft_vllm_plugin.aliases import ALIASES, normalise_architectures, register_aliases, registrable  # noqa: E402

from blockdraft.serve.draft_aliases import ALIASES as PREFLIGHT_ALIASES  # noqa: E402
from blockdraft.vllm_runtime.probe import ALIAS_PLUGIN  # noqa: E402


@dataclass(frozen=True)
class Lazy:  # as vLLM's _LazyRegisteredModel
    module_name: str
    class_name: str


class DFlash2Model:  # a class vLLM imported already (a _RegisteredModel holds it)
    pass


@dataclass(frozen=True)
class Backed:
    model_cls: type


class StandInRegistry:
    """What the plugin uses of vLLM's ModelRegistry: `models` and `register_model` (which, like
    vLLM's, turns "module:Class" into a lazy entry and a class into a class-backed one)."""

    def __init__(self, models):
        self.models = dict(models)
        self.calls = []

    def register_model(self, arch, model_cls):
        self.calls.append((arch, model_cls))
        self.models[arch] = Lazy(*model_cls.split(":")) if isinstance(model_cls, str) else Backed(model_cls)


def vllm_like():
    return StandInRegistry({
        "DFlashDraftModel": Lazy("vllm.model_executor.models.qwen3_dflash", "DFlashQwen3ForCausalLM"),
        "DFlash2DraftModel": Backed(DFlash2Model),
        "Qwen3DSparkModel": Lazy("vllm.model_executor.models.qwen3_dspark", "Qwen3DSparkForCausalLM"),
        # vLLM's DeepSeek-V4 DSpark draft: the name vLLM itself renames a qwen3 one from, never an alias target.
        "DSparkDraftModel": Lazy("vllm.models.deepseek_v4", "DSparkDeepseekV4ForCausalLM"),
    })


def test_missing_aliases_point_at_vllms_own_entries_lazy_and_class_backed():
    registry = vllm_like()
    added, present, missing = register_aliases(registry)
    assert (added, present, missing) == (["Qwen3DFlashDraftModel", "Qwen3DFlash2DraftModel", "Qwen3DSparkDraftModel"], [], [])
    assert registry.models["Qwen3DFlashDraftModel"] == registry.models["DFlashDraftModel"]  # stays lazy
    assert registry.calls[0] == ("Qwen3DFlashDraftModel", "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM")
    assert registry.models["Qwen3DFlash2DraftModel"].model_cls is DFlash2Model
    assert registry.calls[2] == ("Qwen3DSparkDraftModel", "vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM")


def test_an_alias_the_registry_has_is_never_overwritten_and_a_second_call_changes_nothing():
    own = Lazy("vllm.model_executor.models.other", "TheirDraft")
    registry = vllm_like()
    registry.models["Qwen3DFlashDraftModel"] = own
    assert register_aliases(registry) == (["Qwen3DFlash2DraftModel", "Qwen3DSparkDraftModel"], ["Qwen3DFlashDraftModel"], [])
    before, calls = dict(registry.models), len(registry.calls)
    assert register_aliases(registry) == ([], list(ALIASES), [])
    assert registry.models == before and len(registry.calls) == calls and registry.models["Qwen3DFlashDraftModel"] is own


def test_an_alias_without_a_vllm_implementation_is_not_registered():
    registry = StandInRegistry({"DFlashDraftModel": Lazy("m", "C")})  # a vLLM without DFlash2 and DSpark
    assert register_aliases(registry) == (["Qwen3DFlashDraftModel"], [], ["Qwen3DFlash2DraftModel", "Qwen3DSparkDraftModel"])
    assert "Qwen3DFlash2DraftModel" not in registry.models and "Qwen3DSparkDraftModel" not in registry.models


def test_without_the_rename_only_aliases_vllm_does_not_select_by_name_are_registered():
    # vLLM picks DFlash2 by the literal DFlash2DraftModel and the Qwen3 DSpark path by the literal
    # Qwen3DSparkModel (any other DSpark name is read as a DeepSeek-V4 draft): without the rename
    # their aliases would resolve to the right class and still be run as something else.
    only = registrable(ALIASES, renamed=False)
    assert only == {"Qwen3DFlashDraftModel": "DFlashDraftModel"}
    assert register_aliases(vllm_like(), only) == (["Qwen3DFlashDraftModel"], [], [])
    assert registrable(ALIASES, renamed=True) == ALIASES


@pytest.mark.parametrize("alias,name", list(ALIASES.items()))
def test_an_alias_is_read_as_its_registry_name_in_memory(alias, name):
    registry = vllm_like()
    register_aliases(registry)
    config = SimpleNamespace(architectures=[alias], model_type="qwen3")
    assert normalise_architectures(config, registry) == ([alias], [name])
    assert config.architectures == [name]
    assert normalise_architectures(config, registry) is None  # already the registry name


def test_a_qwen3_dspark_alias_is_read_as_the_literal_name_vllm_keeps_on_the_qwen3_path():
    registry = vllm_like()
    register_aliases(registry)
    config = SimpleNamespace(architectures=["Qwen3DSparkDraftModel"], model_type="qwen3")
    assert normalise_architectures(config, registry) == (["Qwen3DSparkDraftModel"], ["Qwen3DSparkModel"])
    # vLLM's own names are never renamed: DSparkDraftModel (DeepSeek-V4, or qwen3 renamed by vLLM itself)
    # and Qwen3DSparkModel stay as they are.
    for name in ("DSparkDraftModel", "Qwen3DSparkModel"):
        assert normalise_architectures(SimpleNamespace(architectures=[name], model_type="qwen3"), registry) is None


def test_names_vllm_serves_differently_or_not_at_all_are_left_alone():
    registry = vllm_like()
    registry.models["Qwen3DFlash2DraftModel"] = Lazy("vllm.model_executor.models.other", "TheirDFlash2")
    config = SimpleNamespace(architectures=["Qwen3DFlash2DraftModel"])
    assert normalise_architectures(config, registry) is None and config.architectures == ["Qwen3DFlash2DraftModel"]
    unregistered = SimpleNamespace(architectures=["Qwen3DFlashDraftModel"])
    assert normalise_architectures(unregistered, vllm_like()) is None  # the plugin did not add it
    assert normalise_architectures(SimpleNamespace(architectures=None), registry) is None


def test_the_log_line_says_what_was_done():
    line = summary(["Qwen3DFlashDraftModel"], ["Qwen3DFlash2DraftModel"], [], True)
    assert line.startswith("registered Qwen3DFlashDraftModel -> DFlashDraftModel")
    assert "already had Qwen3DFlash2DraftModel" in line and "hooked" in line


def test_the_plugin_is_a_dependency_free_vllm_general_plugin_matching_the_preflight():
    project = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())
    assert project["project"]["dependencies"] == []
    points = project["project"]["entry-points"]["vllm.general_plugins"]
    assert points == {ALIAS_PLUGIN: "blockdraft_vllm_plugin:register"}
    assert ALIASES == PREFLIGHT_ALIASES
