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
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 3, proc.stderr[-2000:]
