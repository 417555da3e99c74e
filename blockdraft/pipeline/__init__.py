"""From a target to a draft proven in vLLM: gate (with gate=true) -> regen -> capture -> train -> export -> serve (app.py)."""
