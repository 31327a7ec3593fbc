"""The tier's worker in a process of its own (option ``worker``, default "auto").

Why. vLLM's engine core holds the GIL for most of a step. A worker thread in
its process (orbitkv.vllm_tier.link) needs the GIL between every call to the
peer, every completion poll and every staging copy, so it ran at the engine
loop's pace: on an H100 (2026-12-06) tier lookups took 88-124 ms and
promotions 210-270 ms. Here the Link runs in a child interpreter that maps
vLLM's pool file by path (its rows are the same pages); the scheduler side
only passes commands and answers over a socket pair, one message each.

The scheduler side (``ProcessLink``) offers what the tier uses of a Link:
``commands`` and ``results`` queues, ``mode``, ``ready``, ``unsettled()``,
``stores_zero_copy``, ``start`` and ``close``. Two threads of its own move
the messages: a sender (commands to the child) and a receiver (answers and
state back). The child sends its state (``Link.state``) before any answer
that follows a change of it, so an answer never arrives ahead of the state
it left.

The child dies (killed, a crash): every lookup it owed is answered absent,
every load and staged store fails at once. A store the peer reads from
vLLM's pool in place stays open, its rows pinned: the peer may still be
reading them. A new child is started and *adopts* those stores
(``Link.adopt``): it ends them, as failed, once the peer answered after the
adoption and the store's deadline has passed since, or the peer was seen
gone (the rule of link.py, "Slots"). A child that cannot start (no hello)
is not tried again: at vLLM's start the tier runs a thread instead (worker
"auto"); after a death the tier stays off (lookups absent, jobs failed) and
the adopted stores stay open until ``close``.

The child ends when its socket reaches EOF (``close``, or vLLM's process is
gone) or its parent changes (vLLM was killed and it was re-parented).

    python -m orbitkv.vllm_tier.worker <fd>      (started by ProcessLink)
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Optional

import numpy as np

from orbitkv.vllm_tier.config import TierConfig
from orbitkv.vllm_tier.link import Job, Link, Outcome
from orbitkv.vllm_tier.staging import PoolRegion

log = logging.getLogger(__name__)

# How long a child may take to start and say hello (imports on a loaded host).
HELLO_TIMEOUT_S = 60.0
# After a child that had said hello died: the first wait before the next one.
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
# The child: how often it looks at its parent, and at its Link's state.
PARENT_CHECK_S = 0.5
STATE_CHECK_S = 0.05
_STOP = object()


class WorkerUnavailable(Exception):
    pass


def _misses(body: list) -> tuple:
    return ("lookup", [(p.key, p.generation, False) for p, _ in body])


def _failed(job: Job) -> tuple:
    bad = job.keys if job.is_load else ()
    return ("job", Outcome(job.job_id, False, None, bad, 0.0, 0))


class _Child:
    """One worker process and its end of the socket pair."""

    def __init__(self, init: dict) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "orbitkv.vllm_tier.worker", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._sock = ours
        self.conn = Connection(os.dup(ours.fileno()))
        try:
            self.conn.send(init)
        except OSError:  # it died at once: reap it
            self.kill()
            raise

    def hello(self, timeout: float) -> dict:
        """The child's first state, or WorkerUnavailable."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.conn.poll(0.1):
                try:
                    kind, body = self.conn.recv()
                except (EOFError, OSError):
                    break
                if kind == "state":
                    return body
            elif self.proc.poll() is not None:
                break
        self.kill()
        raise WorkerUnavailable(f"the tier's worker process did not start (exit {self.proc.poll()})")

    def end_input(self) -> None:
        """EOF for the child's reader: it stops once its jobs have ended."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        for c in (self.conn, self._sock):
            try:
                c.close()
            except OSError:
                pass


class ProcessLink:
    """The scheduler side of a worker process (see the module docstring)."""

    def __init__(self, cfg: TierConfig, layout: Any, pool: np.ndarray, engine_id: str) -> None:
        region = PoolRegion.try_open(pool)
        if region is None:
            raise WorkerUnavailable("vLLM's CPU pool is not a shared file a worker process can map")
        rows, row_bytes = pool.shape
        self._init = {"cfg": cfg, "layout": layout, "engine_id": engine_id, "path": region.path,
                      "offset": region.segments[0].offset, "rows": int(rows), "row_bytes": int(row_bytes),
                      "parent": os.getpid(), "adopt": []}
        region.close()
        self.cfg = cfg
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._child: Optional[_Child] = None  # None: none running (starting, or off)
        self._state: dict = {"ready": False, "unsettled": 0, "mode": "closed", "stores_zero_copy": False,
                             "load_slots": 0}
        self._lookups: collections.deque = collections.deque()  # lookup bodies the child owes, in order
        self._jobs: dict[int, Job] = {}  # job id -> job the child owes
        self._closing = False
        self._closed = False
        self._restarts = 0
        self._child = self._spawn([])  # raises WorkerUnavailable: the tier runs a thread instead
        self._sender = threading.Thread(target=self._send_loop, name="orbitkv-vtier-send", daemon=True)
        self._receiver = threading.Thread(target=self._receive_loop, name="orbitkv-vtier-recv", daemon=True)

    def _spawn(self, adopt: list) -> _Child:
        try:
            child = _Child(dict(self._init, adopt=adopt))
        except OSError as e:  # no interpreter to start, or it died at once
            raise WorkerUnavailable(f"the tier's worker process could not start: {e}") from None
        self._state = child.hello(HELLO_TIMEOUT_S)
        return child

    # what the tier asks --------------------------------------------------------

    def start(self) -> None:
        self._sender.start()
        self._receiver.start()

    @property
    def mode(self) -> str:
        return self._state["mode"]

    @property
    def ready(self) -> bool:
        return self._child is not None and self._state["ready"]

    @property
    def stores_zero_copy(self) -> bool:
        return self._state["stores_zero_copy"]

    @property
    def load_slots(self) -> int:
        return self._state["load_slots"]

    def unsettled(self) -> int:
        return self._state["unsettled"]

    @property
    def pid(self) -> Optional[int]:
        child = self._child
        return child.proc.pid if child is not None else None

    def close(self, timeout: float) -> None:
        """Stops the child once its jobs have ended (answered as failures if
        not done), then the threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._closing = True
            child = self._child
        self.commands.put(_STOP)
        self._sender.join(timeout)
        if child is not None:
            child.end_input()
            try:
                child.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.error("orbitkv tier: the worker process did not stop within %.1fs; killed", timeout)
        self._receiver.join(timeout)
        if child is not None:
            child.kill()
        self._answer_owed(held_too=True)

    # the sender and the receiver -----------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            cmd = self.commands.get()
            if cmd is _STOP:
                return
            kind, body = cmd
            with self._lock:
                child = self._child
                if child is not None:
                    if kind == "lookup":
                        self._lookups.append(body)
                    else:
                        self._jobs[body.job_id] = body
            if child is None:  # none running: answered at once
                self.results.put(_misses(body) if kind == "lookup" else _failed(body))
                continue
            try:
                child.conn.send(cmd)
            except OSError:  # it died: the receiver answers what it owed
                pass

    def _receive_loop(self) -> None:
        while True:
            child = self._child
            if child is None:
                return
            try:
                kind, body = child.conn.recv()
            except (EOFError, OSError):
                if not self._child_died(child):
                    return
                continue
            with self._lock:
                if kind == "state":
                    self._state = body
                    continue
                if kind == "lookup":
                    if self._lookups:
                        self._lookups.popleft()
                else:
                    self._jobs.pop(body.job_id, None)
            self.results.put((kind, body))

    def _child_died(self, child: _Child) -> bool:
        """Answers what the child owed and starts another; False when none
        runs now (closing, or it could not start)."""
        child.kill()
        with self._lock:
            closing = self._closing
            self._child = None
        if closing:
            return False
        log.error("orbitkv tier: the worker process (pid %d) died (exit %s); starting another",
                  child.proc.pid, child.proc.returncode)
        held = self._answer_owed(held_too=False)
        with self._lock:  # owed until a worker settles them, or close ends them
            self._jobs.update((j.job_id, j) for j in held)
        backoff = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * (2 ** self._restarts))
        self._restarts += 1
        time.sleep(backoff)
        if self._closing:
            return False
        try:
            new = self._spawn(held)
        except WorkerUnavailable as e:
            # The held stores stay open (the peer may still read their rows)
            # until close ends them, as an unsettled store does with a peer
            # that never answers again.
            log.error("orbitkv tier: %s; the tier is off (lookups absent) until vLLM restarts", e)
            return False
        with self._lock:
            if not self._closing:
                self._child = new
                return True
        new.kill()
        return False

    def _answer_owed(self, held_too: bool) -> list:
        """Answers every lookup and job the dead child owed; stores it read
        from vLLM's pool in place are returned instead (unless held_too)."""
        with self._lock:
            lookups, jobs = list(self._lookups), list(self._jobs.values())
            self._lookups.clear()
            self._jobs.clear()
        for body in lookups:
            self.results.put(_misses(body))
        held = [j for j in jobs if not j.is_load and self._state["stores_zero_copy"] and not held_too]
        self._answer_jobs([j for j in jobs if j not in held])
        return held

    def _answer_jobs(self, jobs: list) -> None:
        for j in jobs:
            self.results.put(_failed(j))


# the child ---------------------------------------------------------------------------


def _map_pool(init: dict) -> tuple[mmap.mmap, np.ndarray]:
    """vLLM's pool file, mapped whole and its page tables filled now: a
    fresh mapping would otherwise take a page fault on the first copy into
    every 4 KiB of it (a 1.2 GB promotion: 295 K faults)."""
    fd = os.open(init["path"], os.O_RDWR)
    try:
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        m = mmap.mmap(fd, os.fstat(fd).st_size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    rows, row_bytes = init["rows"], init["row_bytes"]
    pool = np.frombuffer(m, dtype=np.uint8, count=rows * row_bytes, offset=init["offset"]).reshape(rows, row_bytes)
    return m, pool


def _forward(link: Link, conn: Connection, stop: threading.Event) -> None:
    """Sends the Link's answers, each after the state it changed."""
    last = None
    while True:
        try:
            item = link.results.get(timeout=STATE_CHECK_S)
        except queue.Empty:
            item = None
            if stop.is_set():
                return
        state = link.state() if link.store_lane is not None else None
        try:
            if state is not None and state != last:
                conn.send(("state", state))
                last = state
            if item is not None:
                conn.send(item)
        except OSError:
            return


def child_main(fd: int) -> int:
    logging.basicConfig(level=os.environ.get("ORBITKV_LOG_LEVEL", "INFO"),
                        format="%(asctime)s orbitkv-vtier-worker[%(process)d] %(levelname)s %(message)s")
    conn = Connection(fd)
    init = conn.recv()
    cfg: TierConfig = init["cfg"]
    mapping, pool = _map_pool(init)
    link = Link(cfg, init["layout"], pool, init["engine_id"])
    for job in init["adopt"]:
        link.adopt(job)
    conn.send(("state", link.state()))
    link.start()
    stop = threading.Event()
    fwd = threading.Thread(target=_forward, args=(link, conn, stop), name="orbitkv-vtier-fwd", daemon=True)
    fwd.start()
    while os.getppid() == init["parent"]:
        try:
            if not conn.poll(PARENT_CHECK_S):
                continue
            link.commands.put(conn.recv())
        except (EOFError, OSError):
            break
    longest = max(cfg.store_deadline_ms, cfg.load_deadline_ms) / 1000 + cfg.abandon_grace_s + cfg.rpc_timeout_s
    link.close(longest + 5.0)
    stop.set()
    fwd.join(longest)
    del pool
    try:
        mapping.close()
    except BufferError:  # a view outlived the Link: the process ends anyway
        pass
    return 0


if __name__ == "__main__":
    sys.exit(child_main(int(sys.argv[1])))
