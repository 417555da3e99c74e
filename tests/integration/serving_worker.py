"""Runs scripts in the vLLM serving environment without paying vLLM's import for each one.

Started once per test session with `.venv-serve/bin/python` (tests/integration/serving_env.py starts it),
it imports vLLM's heavy modules (about 6 s here) and then answers one JSON request a line on stdin:

    {"argv": ["scripts/check_vllm_weights.py", "--draft", ...] | ["-c", "<code>", ...],
     "cwd": ..., "env": {...}, "stdout": <file>, "stderr": <file>}

Each request runs in a child forked from this process, so it starts with vLLM already imported and leaves
nothing behind for the next one (no module state, environment or working directory carries over): as if
`python <argv>` had run in a fresh process. The reply is one line, {"returncode": N}.
"""

import json
import os
import runpy
import sys
import traceback


def preload() -> None:
    """What every check imports; imported before any fork, so no child pays for it."""
    import torch  # noqa: F401
    import vllm  # noqa: F401
    import vllm.config  # noqa: F401
    import vllm.distributed  # noqa: F401
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.model_executor.models.qwen3_dflash  # noqa: F401
    import vllm.transformers_utils.config  # noqa: F401


def run_request(request: dict) -> int:
    """In the forked child: the script as `python <argv>` would run it; returns its exit code."""
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as done:
        code = done.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, with exit code 1
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def main() -> None:
    if "--detach" in sys.argv:
        # Leave the process that started us (it exits at once and is reaped): the worker is then no child
        # of the test session, whose serve-failure tests check that it leaves no process of its own behind.
        if os.fork():
            os._exit(0)
    preload()
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os._exit(run_request(request))
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"returncode": code}), flush=True)


if __name__ == "__main__":
    main()
