"""EngineLoop: one thread owns the Engine; any number of callers submit and read events.

Callers talk to the loop only through queues: commands in (add, abort), per-request events
out: ("tokens", [ids]), ("done", info), ("error", {"code": HTTP status, "message": text}).
The loop steps the engine while it has work, including steps with no tokens while external
transfers are pending (polled every transfer_poll_s), and otherwise blocks on the command
queue.
"""

from __future__ import annotations

import itertools
import queue
import threading
import traceback
from typing import Any, Dict, List, Optional, Sequence

from .engine import Engine
from .request import FINISH_REASON, Request

_ids = itertools.count()


class EngineDead(RuntimeError):
    """The loop has stopped (closed or failed); no request can be served."""


class RequestHandle:
    def __init__(self, request_id: str):
        self.request_id = request_id
        self.events: "queue.Queue[tuple]" = queue.Queue()
        self.sent = 0


class EngineLoop:
    def __init__(self, engine: Engine, transfer_poll_s: float = 0.001, idle_wait_s: float = 0.5):
        self.engine = engine
        self.transfer_poll_s = transfer_poll_s
        self.idle_wait_s = idle_wait_s
        self.error: Optional[str] = None
        self._cmds: "queue.Queue[tuple]" = queue.Queue()
        self._handles: Dict[str, RequestHandle] = {}
        self._stop = threading.Event()
        self._stats = engine.stats()
        self._thread = threading.Thread(target=self._run, name="refengine-loop", daemon=True)
        self._thread.start()

    # -- callers --------------------------------------------------------------------------
    def submit(self, prompt_token_ids: Sequence[int], max_tokens: int,
               kv_transfer_params: Optional[Dict[str, Any]] = None) -> RequestHandle:
        if not self.alive():
            raise EngineDead(self.error or "engine loop stopped")
        h = RequestHandle(f"cmpl-{next(_ids)}")
        self._cmds.put(("add", h, list(prompt_token_ids), max_tokens, kv_transfer_params))
        return h

    def abort(self, request_id: str) -> None:
        self._cmds.put(("abort", request_id))

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set() and self.error is None

    def stats(self) -> Dict[str, float]:
        return dict(self._stats)

    def close(self, timeout_s: float = 30.0) -> None:
        """Idempotent: stop stepping, fail what is in flight. The Engine is the caller's."""
        self._stop.set()
        self._cmds.put(("wake",))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    # -- the loop thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain(self._wait_time())
                if self._stop.is_set():
                    break
                if self.engine.has_work():
                    self._route(self.engine.step())
                    self._stats = self.engine.stats()
        except Exception:
            self.error = traceback.format_exc()
        finally:
            self._fail_all(self.error or "engine loop stopped")

    def _wait_time(self) -> float:
        if not self.engine.has_work():
            return self.idle_wait_s
        if self.engine.last_step_tokens == 0:
            return self.transfer_poll_s  # nothing computable: wait for transfers, don't spin
        return 0.0

    def _drain(self, wait: float) -> None:
        try:
            cmd = self._cmds.get(timeout=wait) if wait else self._cmds.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, h, prompt, max_tokens, params = cmd
            try:
                self.engine.add_request(prompt, max_tokens, h.request_id, params)
            except ValueError as e:
                h.events.put(("error", {"code": 400, "message": str(e)}))
                return
            self._handles[h.request_id] = h
        elif cmd[0] == "abort":
            req = self.engine.abort(cmd[1])
            if req is not None:
                self._route([req])

    def _route(self, changed: List[Request]) -> None:
        for req in changed:
            h = self._handles.get(req.request_id)
            if h is None:
                continue
            new = req.output_token_ids[h.sent:]
            if new:
                h.events.put(("tokens", list(new)))
                h.sent += len(new)
            if req.status.finished:
                del self._handles[req.request_id]
                h.events.put(("done", finish_info(req)))

    def _fail_all(self, message: str) -> None:
        err = ("error", {"code": 503, "message": f"engine stopped: {message[-2000:]}"})
        for h in self._handles.values():
            h.events.put(err)
        self._handles.clear()
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                cmd[1].events.put(err)


def finish_info(req: Request) -> Dict[str, Any]:
    return {
        "finish_reason": FINISH_REASON[req.status],
        "prompt_tokens": req.num_prompt_tokens,
        "completion_tokens": req.num_output_tokens,
        # Both at the first admission (vLLM's num_cached_tokens is set once): after a
        # preemption the request's own blocks are no cache hit of its prompt.
        "prefix_cache_hit_tokens": max(req.num_cached_tokens, 0),
        "restored_tokens": req.first_restored_tokens,
        "readmission_restored_tokens": req.restored_tokens - req.first_restored_tokens,
        "kv_transfer_params": req.kv_transfer_params_out,
    }
