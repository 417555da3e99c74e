"""The project's reference engine: speculative decoding with a target and a draft of any kind in this process
(transformers, batch size 1), lossless by construction. decoder.py the decoding loop, sampling.py the
distribution a token is drawn from, target_state.py the target's side (its cache, or a re-read). The smoke
serve, the gate and the eval check a draft with it where vLLM cannot serve it; it imports no stage, so it
sits below them all."""
