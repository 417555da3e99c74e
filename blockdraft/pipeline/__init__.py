"""From a target to a draft proven in vLLM: regen -> capture -> train -> export -> gate -> serve (app.py)."""
