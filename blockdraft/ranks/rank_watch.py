"""What every rank knows of the others, through the rendezvous store: who is alive, who failed and why.

A collective only ends when every rank enters it, and a rank stuck in one learns nothing until the process
group's timeout. Three things here keep a run from waiting on a rank that will never come:

- heartbeats: each rank bumps a counter every `interval` seconds from a daemon thread and watches the next
  rank's (a ring: every rank watched by one other, O(1) store traffic per rank at any world size). A counter
  that stands still for `timeout_s` means that process or its node is lost: the watcher posts it as a failure.
- failures: a rank that raises posts its error; every other rank's watcher prints it and ends its process
  within seconds, even when that process is blocked inside a collective (a thread cannot interrupt one).
- patient waits (`wait_all`): a barrier in the store, not in the process group, for ranks that wait on another
  rank's long chore (tokenising the data, hashing a store, writing a checkpoint). It waits as long as the
  chore's rank beats, whatever the process group's timeout, and raises at once when any rank fails.

Counters, not clock times: hosts' clocks need not agree. The store is the process group's, which is each restart
attempt's own (distributed.py `_attempt_store`): a restarted group starts from no beats and no failure.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import Optional

FAILURE = "failure"
# A rank that learned of a failure while blocked in a collective gets this long to leave by itself (its own
# exception handling, a patient wait raising) before its process is ended for it.
GRACE_S = 3.0


class PeerFailed(RuntimeError):
    """Another rank failed (or was lost); this rank stops too. The message is that rank's."""


class RankWatch:
    def __init__(self, store, rank: int, world_size: int, timeout_s: float, interval_s: Optional[float] = None):
        self.store, self.rank, self.world = store, rank, world_size
        self.timeout_s = float(timeout_s)
        self.interval = interval_s or max(0.05, min(1.0, self.timeout_s / 5))
        self.prefix = "blockdraft/watch/"
        self.exiting = False  # set once this rank handles its own error: the watcher leaves it to finish
        self._stop = threading.Event()
        self._waits = 0
        self._thread: Optional[threading.Thread] = None

    def _key(self, name: str) -> str:
        return self.prefix + name

    # --- the watcher thread -------------------------------------------------------------
    def start(self) -> "RankWatch":
        self.store.add(self._key(f"beat/{self.rank}"), 1)
        self._thread = threading.Thread(target=self._run, name="blockdraft-rank-watch", daemon=True)
        self._thread.start()
        # A daemon thread still inside a store call when the interpreter finalizes is ended mid C++ frame, and
        # the process aborts ("terminate called without an active exception"): a process that exits without
        # stop() ends the thread first. It does not say "done": its neighbour still sees it go silent.
        atexit.register(self.halt)
        return self

    def halt(self) -> None:
        """The watcher thread ends; nothing is told to the other ranks."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=5)
        atexit.unregister(self.halt)

    def stop(self) -> None:
        """This rank is done: its neighbour stops watching it, and its thread ends."""
        if self._thread is None:
            return
        self.halt()
        try:
            self.store.set(self._key(f"done/{self.rank}"), "1")
        except Exception:  # the store's host may be gone at the very end: nothing left to tell
            pass

    def set_timeout(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)

    def _run(self) -> None:
        neighbour = (self.rank + 1) % self.world
        seen, seen_at, store_ok_at = None, time.monotonic(), time.monotonic()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            try:
                self.store.add(self._key(f"beat/{self.rank}"), 1)
                failure = self.posted_failure()
                if failure is None and neighbour != self.rank:
                    count = self.store.add(self._key(f"beat/{neighbour}"), 0)
                    if count != seen:
                        seen, seen_at = count, now
                    elif now - seen_at > self.timeout_s and not self.store.check([self._key(f"done/{neighbour}")]):
                        failure = (f"rank {neighbour} has not beaten for {now - seen_at:.0f} s "
                                   f"(distributed.timeout_s={self.timeout_s:g}): its process or its node is lost")
                        self.post_failure(failure, own=False)
                store_ok_at = now
            except Exception as err:  # the store's host (node 0) is gone, or the network to it
                if now - store_ok_at > self.timeout_s:
                    failure = f"the rendezvous store has not answered for {now - store_ok_at:.0f} s ({err}): node 0 is lost"
                else:
                    continue
            if failure is not None:
                self._abort(failure)
                return

    def _abort(self, failure: str) -> None:
        if self.exiting:
            return
        print(f"[rank {self.rank}] stopping: {failure}", file=sys.stderr, flush=True)
        try:
            self.store.add(self._key("failure_seen"), 1)
        except Exception:
            pass
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)
        if self.exiting or self._stop.is_set():
            return  # the main thread left on its own
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    # --- failures -----------------------------------------------------------------------
    def post_failure(self, text: str, own: bool = True) -> None:
        """Tell every rank this run stops and why. The first failure posted is the one every rank reports."""
        if own:
            self.exiting = True
        try:
            if self.store.add(self._key("failures"), 1) == 1:
                self.store.set(self._key(FAILURE), text)
            else:  # a failure is posted already: this rank knows the run stops (a refusal every rank makes alike)
                self.store.add(self._key("failure_seen"), 1)
            if own:
                self._await_others_seeing_it()
        except Exception:  # without a store no rank can be told; the process group's timeout remains
            pass

    def _await_others_seeing_it(self) -> None:
        """The store may live in this process (a launch without torchrun's agent, rank 0): it stays up until
        every other rank has read the failure, or a few seconds. Under torchrun the agent holds the store."""
        if self.rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            return
        deadline = time.monotonic() + min(2 * GRACE_S, self.timeout_s)
        while time.monotonic() < deadline and self.store.add(self._key("failure_seen"), 0) < self.world - 1:
            time.sleep(0.05)

    def posted_failure(self) -> Optional[str]:
        """The first failure any rank posted, or None."""
        if not self.store.check([self._key(FAILURE)]):
            return None
        return self.store.get(self._key(FAILURE)).decode(errors="replace")

    def raise_if_failed(self) -> None:
        failure = self.posted_failure()
        if failure is not None:
            self.exiting = True  # this rank leaves through its own exception: the watcher lets it
            self.store.add(self._key("failure_seen"), 1)
            raise PeerFailed(failure)

    # --- patient waits ------------------------------------------------------------------
    def wait_all(self, what: str) -> None:
        """Return once every rank has called wait_all as often as this one; raise PeerFailed if any rank fails
        first. No timeout of its own: a rank that stops beating is posted as failed by its watcher."""
        self._waits += 1
        key = self._key(f"wait/{self._waits}")
        arrived = self.store.add(key, 1)
        delay, started, said = 0.005, time.monotonic(), 0
        while arrived < self.world:
            self.raise_if_failed()
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
            arrived = self.store.add(key, 0)
            waited = time.monotonic() - started
            if waited > 60 * (said + 1):  # a long wait shows it is one, and on what
                said += 1
                print(f"[rank {self.rank}] waiting {waited:.0f} s for {self.world - arrived} rank(s): {what}", flush=True)
