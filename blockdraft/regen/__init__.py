"""The regen stage: the target answers the prompts, and its answers become the training and held-out rows.

app.py the `regen.yaml` app and its resume bookkeeping; prompt_plan.py which prompts each split takes;
turns.py the turns of a conversation and their rollout; runner.py the rows in flight; shards.py the rows
on disk; vllm_backend.py and hf_backend.py who answers.
"""
