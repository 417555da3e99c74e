"""The serving vLLM is asked once per architecture and VLLM_* environment in a process: each ask imports vLLM."""

from blockdraft.vllm_runtime import probe


def test_each_architecture_is_asked_once_and_a_vllm_variable_asks_again(monkeypatch):
    asked = []

    def ask(python, architectures, timeout_s):
        asked.append(list(architectures))
        return {arch: f"{arch} as seen with {probe.os.environ.get('VLLM_PLUGINS')}" for arch in architectures}

    monkeypatch.setattr(probe, "_ask", ask)
    monkeypatch.setattr(probe, "_ANSWERS", {})
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert probe.probe_architectures("py", ["A", "B"]) == {"A": "A as seen with None", "B": "B as seen with None"}
    assert probe.probe_vllm("py", "B") == "B as seen with None"
    assert probe.probe_architectures("py", ["B", "C"])["C"] == "C as seen with None"
    assert asked == [["A", "B"], ["C"]]
    monkeypatch.setenv("VLLM_PLUGINS", "none")
    assert probe.probe_vllm("py", "A") == "A as seen with none" and asked[-1] == ["A"]
