"""Regression for the seed's restore-admission stall.

A small model of vLLM's block allocator and waiting-queue pass drives the
connector's scheduler half. The captured queue: a cold 8,192-token request
at the head needs 128 blocks with only 127 free; behind it an already
completed restore holds 128 blocks. vLLM's pass stops at the head's failed
allocation, so without the gate neither request ever moves; with the gate
the head's lookup defers (returns None, which skips it without stopping the
pass), the restore is scheduled, finishes and frees its blocks, and then the
head runs too.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from orbitkv.keys import Layout
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.scheduler import SchedulerHalf
from tests.vllm_fakes import DictLookup, KVConnectorOutput, NewRequestData, Request, SchedulerOutput

BT = PT = 64
LAYOUT = Layout("Qwen/Qwen3-8B", "b968826", "bf16", 36, 8, 128, 0, 1, PT, "vllm-flash")


@dataclasses.dataclass
class Req:
    req: Request
    blocks: list[int] = dataclasses.field(default_factory=list)
    status: str = "WAITING"  # WAITING | WAITING_FOR_REMOTE_KVS | RUNNING | DONE
    computed: int = 0
    external: int = 0
    load_done: bool = False

    @property
    def id(self) -> str:
        return self.req.request_id

    @property
    def need_blocks(self) -> int:
        return math.ceil(len(self.req.prompt_token_ids) / BT)


class Model:
    """vLLM-like scheduling: running requests compute one step then finish
    (prefill only), the waiting pass stops at the first failed allocation,
    a None lookup skips the request, async loads end one step later."""

    def __init__(self, conn: SchedulerHalf, free_blocks: list[int]):
        self.conn = conn
        self.free = free_blocks
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.done: list[str] = []
        self.loading: list[Req] = []

    def _alloc(self, r: Req, n: int) -> bool:
        if n > len(self.free):
            return False
        r.blocks += [self.free.pop() for _ in range(n)]
        return True

    def step(self) -> None:
        so = SchedulerOutput()
        for r in self.running:  # a running request finishes after one compute step
            r.status = "DONE"
        finished = [r for r in self.running if r.status == "DONE"]
        self.running = [r for r in self.running if r.status != "DONE"]
        skipped: list[Req] = []
        while self.waiting:
            r = self.waiting[0]
            if r.status == "WAITING_FOR_REMOTE_KVS":
                if not r.load_done:
                    skipped.append(self.waiting.pop(0))
                    continue
                r.status, r.computed = "WAITING", r.external
            n = 0
            if r.computed == 0:
                n, is_async = self.conn.get_num_new_matched_tokens(r.req, 0)
                if n is None:
                    skipped.append(self.waiting.pop(0))
                    continue
            if not self._alloc(r, r.need_blocks - len(r.blocks) if not n else n // BT):
                break  # vLLM stops the pass at the first failed allocation
            self.conn.update_state_after_alloc(r.req, (list(r.blocks),), n)
            self.waiting.pop(0)
            if n:
                r.status, r.external = "WAITING_FOR_REMOTE_KVS", n
                self.loading.append(r)
                skipped.append(r)
                continue
            r.status = "RUNNING"
            self.running.append(r)
            todo = len(r.req.prompt_token_ids) - r.computed
            so.scheduled_new_reqs.append(NewRequestData(r.id, r.req.prompt_token_ids, (list(r.blocks),), r.computed))
            so.num_scheduled_tokens[r.id] = todo
        self.waiting = skipped + self.waiting
        self.conn.build_connector_meta(so)
        recv = {r.id for r in self.loading}
        for r in self.loading:
            r.load_done = True
        self.loading = []
        sending = set()
        for r in finished:
            delay, _ = self.conn.request_finished(r.req, r.blocks)
            self.done.append(r.id)
            self.free += r.blocks
            r.blocks = []
            if delay:
                sending.add(r.id)  # the worker reports saves done at once here
        self.conn.update_connector_output(KVConnectorOutput(finished_sending=sending, finished_recving=recv))

    def progress(self) -> tuple:
        return (tuple(self.done), tuple(r.id for r in self.running), len(self.free))


def _captured_queue(gate: bool) -> Model:
    conn = SchedulerHalf(ConnectorConfig("unused", LAYOUT, BT, gate=gate), DictLookup(), clock=lambda: 0.0)
    restore = Req(Request("restore", list(range(1, 8192 + 2))))  # 8,193 tokens: 128 pages restorable
    conn.backend.store_prefix(LAYOUT, restore.req.prompt_token_ids)
    m = Model(conn, free_blocks=list(range(255)))
    # The restore was admitted earlier: lookup, allocation of 128 blocks, async load.
    n, is_async = conn.get_num_new_matched_tokens(restore.req, 0)
    assert (n, is_async) == (8192, True)
    assert m._alloc(restore, n // BT)
    conn.update_state_after_alloc(restore.req, (list(restore.blocks),), n)
    conn.build_connector_meta(SchedulerOutput())
    restore.status, restore.external, restore.load_done = "WAITING_FOR_REMOTE_KVS", n, True
    conn.update_connector_output(KVConnectorOutput(finished_recving={"restore"}))  # copy complete
    cold = Req(Request("cold", list(range(100_000, 100_000 + 8192))))  # a miss needing 128 blocks
    m.waiting = [cold, restore]  # cold at the head (e.g. preempted, prepended)
    assert len(m.free) == 127 and len(restore.blocks) == 128 and cold.need_blocks == 128
    return m


def test_captured_queue_stalls_without_gate():
    m = _captured_queue(gate=False)
    before = m.progress()
    for _ in range(20):
        m.step()
    assert m.progress() == before, "expected the stall: no request moves"
    assert m.done == [] and [r.id for r in m.waiting] == ["cold", "restore"]


def test_captured_queue_progresses_with_gate():
    m = _captured_queue(gate=True)
    assert m.conn.gate.holder() == "restore"
    for _ in range(20):
        m.step()
        if len(m.done) == 2:
            break
    assert m.done == ["restore", "cold"], m.done
    assert m.conn.gate.holder() is None
    assert len(m.free) == 255 and not m.waiting
    assert not m.conn.backend.leases


@pytest.mark.parametrize("gate", [True, False])
def test_fresh_restore_and_cold_arrivals(gate):
    """Restores and cold requests arriving together all complete when
    capacity allows it, gate or not (the gate only serialises admission)."""
    conn = SchedulerHalf(ConnectorConfig("unused", LAYOUT, BT, gate=gate), DictLookup(), clock=lambda: 0.0)
    m = Model(conn, free_blocks=list(range(300)))
    for i in range(4):
        r = Req(Request(f"warm{i}", [i * 10_000 + t for t in range(1024 + 1)]))
        conn.backend.store_prefix(LAYOUT, r.req.prompt_token_ids)
        m.waiting.append(r)
        m.waiting.append(Req(Request(f"cold{i}", [500_000 + i * 10_000 + t for t in range(4096)])))
    for _ in range(100):
        m.step()
        if len(m.done) == 8:
            break
    assert sorted(m.done) == sorted([f"warm{i}" for i in range(4)] + [f"cold{i}" for i in range(4)])
    assert conn.gate.holder() is None and not conn.backend.leases
