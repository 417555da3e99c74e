"""Serving faults: a taken port, a server that dies mid-run or never comes up, a prompt over
the server's limit, Ctrl-C and SIGTERM mid-run, Ctrl-C again on a server ignoring SIGTERM.
Every one ends with a report (marked incomplete when the run stopped) and with no server
process left.

A fake vLLM stands in (the same command line, a child process like vLLM's engine core,
/health, the completions API enforcing --max-model-len, /metrics), so each fault costs
seconds; one test, marked slow, crashes the real vLLM of .venv-serve.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.serve import harness
from blockdraft.vllm_runtime import server as server_module
from blockdraft.serve.config import DEFAULT_VLLM_PYTHON, ServeConfig
from blockdraft.serve.preflight import plan_serving
from blockdraft.vllm_runtime.probe import VllmInfo
from tests.fake_vllm import INFO_FIELDS, started_pids, write_fake_draft, write_fake_python
from tests.faults.conftest import REPO

psutil = pytest.importorskip("psutil")

# The Ctrl-C / SIGTERM cases run the harness in a child, handled as blockdraft.serve's main does.
DRIVER = r'''
import json, signal, sys
from blockdraft.serve import harness
from blockdraft.serve.cli import terminate_as_interrupt
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.preflight import plan_serving
from blockdraft.vllm_runtime.probe import VllmInfo

info = VllmInfo(**json.loads(sys.argv[2]))
harness.plan_serving = lambda cfg: plan_serving(cfg, probe=lambda *_: info)
# Ctrl-C raises KeyboardInterrupt, as in a command run from a terminal. A suite started as a
# background job of a non-interactive shell (as CI may start it) has SIGINT ignored; an ignored
# signal is inherited, Python leaves it ignored, and the "Ctrl-C" would never reach the harness.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, terminate_as_interrupt)
try:
    harness.run(ServeConfig(**json.loads(sys.argv[1])))
except KeyboardInterrupt:
    sys.exit(130)
'''


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_tiny_target(tmp_path_factory.mktemp("serve_faults") / "target")


@pytest.fixture
def fake(tmp_path, target, monkeypatch):
    """(config for a fake-vLLM run, the fake's directory of pids and argv). A fake server that a
    failing test leaves running is killed after it: it must not disturb the tests that follow."""
    fake_dir = tmp_path / "fake"
    fake_dir.mkdir()
    script = write_fake_python(fake_dir / "python")
    draft = write_fake_draft(tmp_path / "draft")
    monkeypatch.setattr(harness, "plan_serving", lambda cfg: plan_serving(cfg, probe=lambda *_: VllmInfo(**INFO_FIELDS)))
    monkeypatch.setenv("FAKE_DIR", str(fake_dir))
    cfg = ServeConfig(draft_dir=str(draft), target_dir=str(target), vllm_python=str(script), out=str(tmp_path / "out"),
                      num_prompts=4, max_tokens=16, startup_timeout_s=60)
    yield cfg, fake_dir
    for pid in left_running(started_pids(fake_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it exited meanwhile
            pass


def left_running(pids) -> list:
    """Those of `pids` still running (a zombie has exited: only its exit status is left)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def processes_check(fake_dir: Path) -> list:
    started = started_pids(fake_dir)
    problems = [f"server processes left running: {left_running(started)}"] if left_running(started) else []
    return problems + ([] if started else ["the fake server never started: the fault was not injected"])


def report_of(cfg) -> dict:
    return json.loads((Path(cfg.out) / "report.json").read_text())


def test_a_taken_port_moves_the_server_to_another(fake, rep, monkeypatch, record):
    cfg, fake_dir = fake
    taken = server_module.socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    ports = iter([taken_port])
    real_free_port = server_module.free_port
    # The race the harness guards against: a port free when picked, bound by another before vLLM.
    monkeypatch.setattr(server_module, "free_port", lambda: next(ports, None) or real_free_port())
    try:
        report = harness.run(cfg)
    finally:
        taken.close()
    problems = processes_check(fake_dir)
    argv = [json.loads(line) for line in (fake_dir / "argv").read_text().splitlines()]
    ports_used = [a[a.index("--port") + 1] for a in argv]
    if not report["passed"] or report["incomplete"]:
        problems.append(f"the run did not pass after the retry: {report['failures']}")
    if ports_used[0] != str(taken_port) or len(set(ports_used)) < 2:
        problems.append(f"ports tried {ports_used}: the taken one was not tried first, or not left")
    if "Address already in use" not in (Path(cfg.out) / "vllm_baseline.log").read_text():
        problems.append("the log does not show why the first start failed")
    record("the port is taken", "the server moved off the taken port to a free one; the run passed", problems,
           report["timings_s"]["startup_baseline"], "a new free port, up to 3 tries")
    assert not problems, "\n".join(problems)


def test_vllm_dying_mid_run_is_reported_with_its_log_tail(fake, rep, monkeypatch, record):
    cfg, fake_dir = fake
    cfg.servers = "fresh"  # the baseline's whole run finishes before the draft server starts
    monkeypatch.setenv("FAKE_DIE_AFTER_DRAFT", "2")  # the warm-up and one prompt of the draft run, then a crash
    report = harness.run(cfg)
    ended = time.time()
    problems = processes_check(fake_dir)
    died = float((fake_dir / "died").read_text()) if (fake_dir / "died").exists() else None
    if died is None:
        problems.append("the server never died: the fault was not injected")
    if not report["incomplete"] or report["passed"]:
        problems.append("the report is not marked incomplete")
    if "EngineCore died unexpectedly" not in (report["error"] or "") or "last lines" not in (report["error"] or ""):
        problems.append(f"the report's error lacks the server's log tail: {report['error']!r}")
    if report["tokens_generated"]["baseline"] != 4 * cfg.max_tokens:
        problems.append(f"the finished baseline run is not in the report: {report['tokens_generated']}")
    survived = (f"baseline results ({report['tokens_generated']['baseline']} tokens), the error and the log tail "
                "in report.json marked incomplete; no server process left")
    record("vLLM dies mid-run", survived, problems, ended - (died or ended), "the harness stops the server group and writes the report")
    assert not problems, "\n".join(problems)


def test_vllm_that_never_becomes_healthy_times_out_and_stops(fake, rep, monkeypatch, record):
    cfg, fake_dir = fake
    monkeypatch.setenv("FAKE_MODE", "hang")
    cfg.startup_timeout_s = 3
    began = time.monotonic()
    report = harness.run(cfg)
    seconds = time.monotonic() - began
    problems = processes_check(fake_dir)
    if not report["incomplete"] or "startup_timeout_s=3" not in (report["error"] or ""):
        problems.append(f"the timeout is not what the report says: {report['error']!r}")
    if "fake vLLM starting" not in (report["error"] or ""):
        problems.append("the report's error lacks the server's log tail")
    record("vLLM never becomes healthy", "report marked incomplete naming startup_timeout_s and the log tail; no server process left",
           problems, seconds - cfg.startup_timeout_s, "SIGTERM to the server group after the timeout (time after it)")
    assert not problems, "\n".join(problems)


def test_a_prompt_over_the_servers_limit_is_skipped_and_reported(fake, rep, tmp_path, record):
    cfg, fake_dir = fake
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "Say hello."}, {"prompt": "word " * 200}, {"prompt": "Count to three."},
            {"prompt": "Name a colour."}, {"prompt": "Why is the sky blue?"}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg.prompts, cfg.max_model_len = str(prompts), 256
    began = time.monotonic()
    report = harness.run(cfg)
    problems = processes_check(fake_dir)
    if report["prompts_skipped_too_long"] != ["prompts.jsonl line 2"]:
        problems.append(f"skipped: {report['prompts_skipped_too_long']}, expected line 2 alone")
    if not report["passed"] or report["prompts_sent"] != 4:
        problems.append(f"the other prompts did not all run: sent {report['prompts_sent']}, failures {report['failures']}")
    record("a prompt longer than the server's limit", f"{report['prompts_sent']} other prompts served; the long one named in the report",
           problems, time.monotonic() - began, "skipped before sending (the server's limit is max_model_len)")
    assert not problems, "\n".join(problems)


INTERRUPTS = {"Ctrl-C during a run": (signal.SIGINT, True), "SIGTERM to the serve command during a run": (signal.SIGTERM, False)}
SLOW_REPLY_S = 60  # the fake's reply to every request: an interrupt always finds one in flight
# The fake, as vLLM, exits on SIGTERM at once: a harness that stops its servers on the signal
# ends within about 2 s of it. One that waited for the reply in flight, or out the 20 s grace
# period before SIGKILL, fails.
STOP_S = 15


@pytest.fixture
def driver(fake):
    """start(**fake_env) -> (the harness in a child, as blockdraft.serve runs it, its output file),
    returned once a request is in flight. A harness that a failing test leaves running is killed after it."""
    cfg, fake_dir = fake
    started = []

    def start(**fake_env):
        env = {**os.environ, "FAKE_SLOW_S": str(SLOW_REPLY_S), "PYTHONPATH": str(REPO), **fake_env}
        fields = {k: getattr(cfg, k) for k in ("draft_dir", "target_dir", "vllm_python", "out", "num_prompts", "max_tokens", "startup_timeout_s")}
        log = Path(cfg.out).parent / "harness.log"
        with open(log, "wb") as out:  # a file, not a pipe that could fill while nobody reads it
            proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(fields), json.dumps(INFO_FIELDS)], cwd=REPO,
                                    env=env, stdout=out, stderr=subprocess.STDOUT)
        started.append(proc)
        wait_for(fake_dir / "busy", proc, log, 120)
        return proc, log

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"no {path.name} within {timeout_s} s: {tail(log)}"
        time.sleep(0.05)


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-1500:]


def exit_within(proc: subprocess.Popen, log: Path, began: float, seconds: float) -> int:
    """The harness's exit status, failing the test if it is still running `seconds` after `began`."""
    try:
        return proc.wait(max(0.0, began + seconds - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the harness was still running {seconds} s after the signal: {tail(log)}")


def interrupted_run_problems(cfg, fake_dir: Path, code: int, log: Path) -> list:
    """What an interrupted run must leave: exit 130, a report saying so, no server process."""
    problems = processes_check(fake_dir)
    report = report_of(cfg) if (Path(cfg.out) / "report.json").exists() else None
    if code != 130:
        problems.append(f"exit {code}, not 130: {tail(log)}")
    if report is None:
        problems.append(f"no report written: {tail(log)}")
    elif not report["incomplete"] or "interrupted" not in (report["error"] or ""):
        problems.append(f"the report does not say the run was interrupted: {report['error']!r}")
    return problems


@pytest.mark.parametrize("fault", [pytest.param(k, id=v[0].name, marks=[] if v[1] else [pytest.mark.slow]) for k, v in INTERRUPTS.items()])
def test_an_interrupted_run_stops_its_servers(fault, fake, driver, rep, record):
    cfg, fake_dir = fake
    proc, log = driver()
    began = time.monotonic()
    proc.send_signal(INTERRUPTS[fault][0])  # Ctrl-C reaches the harness; the server has its own session
    code = exit_within(proc, log, began, STOP_S)
    seconds = time.monotonic() - began
    problems = interrupted_run_problems(cfg, fake_dir, code, log)
    record(fault, "report marked incomplete (interrupted); every server process stopped", problems, seconds,
           "the harness stops the server group, writes the report, exits 130")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_ctrl_c_again_kills_a_stuck_server_at_once(fake, driver, rep, record):
    cfg, fake_dir = fake
    proc, log = driver(FAKE_STUCK="1")
    proc.send_signal(signal.SIGINT)
    wait_for(fake_dir / "sigterm", proc, log, STOP_S)  # the server ignored it: the harness is in the grace period
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    # Well inside the 20 s grace period: the second Ctrl-C must cut it short, not wait it out.
    code = exit_within(proc, log, began, 10)
    seconds = time.monotonic() - began
    problems = interrupted_run_problems(cfg, fake_dir, code, log)
    record("Ctrl-C again while a stuck server ignores SIGTERM", "report marked incomplete (interrupted); the server killed",
           problems, seconds, "the harness SIGKILLs the server group at once, writes the report, exits 130")
    assert not problems, "\n".join(problems)


# --- the real vLLM ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.serve
@pytest.mark.skipif(not DEFAULT_VLLM_PYTHON.is_file(), reason=f"no serving env at {DEFAULT_VLLM_PYTHON}; run `make setup-serve`")
def test_real_vllm_killed_mid_run_leaves_no_process(rep, tmp_path, reference_run, monkeypatch, record):
    from blockdraft.export.writer import export_draft

    export = export_draft(reference_run / "checkpoints" / "step_40", tmp_path / "export", dtype="float32")
    cfg = ServeConfig(draft_dir=str(export), target_dir=str(REPO / ".cache/targets/tiny-qwen3"), out=str(tmp_path / "out"),
                      num_prompts=2, max_tokens=16, startup_timeout_s=600)
    crashed = {}
    real_complete = harness.complete

    def complete_then_crash(url, *args, **kwargs):
        answer = real_complete(url, *args, **kwargs)
        if not crashed:  # after the warm-up: SIGKILL the API server alone, as a crash would end it
            api = [p for p in psutil.Process().children() if "vllm.entrypoints" in " ".join(p.cmdline())]
            crashed.update(group=api[0].pid, at=time.time(), children=[c.pid for c in api[0].children(recursive=True)])
            api[0].kill()
        return answer

    monkeypatch.setattr(harness, "complete", complete_then_crash)
    report = harness.run(cfg)
    seconds = time.time() - crashed.get("at", time.time())
    problems = []
    if not crashed:
        problems.append("vLLM never answered the warm-up: the fault was not injected")
    left = left_running([crashed.get("group", -1), *crashed.get("children", [])])
    if left or server_module.group_members(crashed.get("group", -1)):
        problems.append(f"vLLM processes left running: {left}")
    if not report["incomplete"] or "last lines" not in (report["error"] or ""):
        problems.append(f"no incomplete report with the log tail: {report['error']!r}")
    record("real vLLM killed mid-run (SIGKILL to its API server)",
           f"report marked incomplete with the log tail; {len(crashed.get('children', []))} engine process(es) stopped",
           problems, seconds, "the harness stops the server group and writes the report")
    assert not problems, "\n".join(problems)
