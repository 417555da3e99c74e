"""A process that exits with its rank watch running (an error path, a script that never calls shutdown) exits
with its own code: without the watch's exit hook, its daemon thread is ended inside a store call while the
interpreter finalizes and the process aborts ("terminate called without an active exception", SIGABRT)."""

import subprocess
import sys

from tests.integration.conftest import REPO

# The watcher beats as fast as it can, so it is inside a store call whenever the interpreter finalizes:
# without the hook, 28 of 30 such exits aborted here.
SCRIPT = """
import time
import torch.distributed as dist
from blockdraft.ranks.rank_watch import RankWatch
store = dist.TCPStore("127.0.0.1", 0, 1, True)
RankWatch(store, 0, 2, 60, interval_s=0.0001).start()
time.sleep(0.2)
raise SystemExit(3)
"""


def test_an_exit_without_shutdown_keeps_its_exit_code():
    # Three exits, side by side: each is its own process, and their imports overlap.
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 3, err[-2000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
