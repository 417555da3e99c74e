"""The regen stage: the target answers the prompts, and its answers become the training and held-out rows.

app.py the `regen.yaml` app and its resume bookkeeping; prompt_plan.py which prompts each split takes;
turns.py the turns of a conversation and their rollout; runner.py the rows in flight and work_queue.py the
prompts still to answer, shared by every server; shards.py the rows on disk; answerers.py who answers:
servers.py the vLLM servers regen starts, endpoints.py the checks every server passes, vllm_backend.py the
requests, hf_backend.py the target in-process.
"""
