"""The engine starts while the host's peer is down and picks it up later.

Every adapter constructs without the peer (lazy client and sessions), serves
with recompute while it is unreachable (lookups miss, saves are skipped and
reported at once, no loads), and once the peer appears its sessions open by
themselves and caching resumes. Each case runs against the in-process fake
and, when ORBITKV_BIN is set, the real peer, started only after the engine."""

import json
import os
import signal
import subprocess
import threading
import time

import grpc
import pytest
import torch

from orbitkv import client as client_mod
from orbitkv import errors, keys
from orbitkv.client import Client
from orbitkv.vllm import OrbitKVMetadata
from orbitkv.vllm.metadata import SaveSpec
from tests.fakepeer import FakePeer
from tests.fixtures import real_peer_handle, start_refengine, wait_until
from tests.shm import flash_layers, pool_bytes, shm_pool
from tests.test_client import guarded
from tests.test_vllm_connector import BS, D, H, L, NB, PT, Engine, _compute_and_save
from tests.vllm_fakes import NewRequestData, Request, SchedulerOutput

UP_WITHIN_S = 10.0  # retry once a second + gRPC reconnect backoff (<= 1 s)
BUSY_S = 0.4  # issue 33's busy spell: four times the 100 ms connect timeout the client once had


class LatePeer:
    """A peer (fake or real) on a fixed socket that is not running until start()."""

    def __init__(self, kind, tmp):
        self.kind = kind
        self.fake = None
        self.real = real_peer_handle(tmp) if kind == "real" else None
        self.socket = self.real.socket if self.real else os.path.join(tmp, "fake.sock")

    def start(self):
        if self.real:
            self.real.start()
        else:
            self.fake = FakePeer(self.socket)

    def metrics(self):
        return self.real.metrics() if self.real else {}

    def stop(self):
        if self.real:
            self.real.stop()
        elif self.fake:
            self.fake.stop()


@pytest.fixture(params=["fake", "real"])
def late_peer(request, tmpdir_short):
    p = LatePeer(request.param, tmpdir_short)
    yield p
    p.stop()


def _layout():
    return keys.Layout("orbitkv/test", "r0", "fp32", L, H, D, 0, 1, PT, "vllm-flash")


class Opens:
    """Records, from its creation on, every session open attempt
    (Client._open: a first open, a lazy retry, a reopen) with its outcome (the
    SessionInfo, or the error it raised), and every wait for the socket to
    become ready (a non-lazy Client's). While the peer is down these show
    whether anything waited for it: an attempt the peer refused (PeerUnavailable,
    nobody listening) ended at once, one that ran out its deadline would be
    PeerTimeout."""

    def __init__(self, monkeypatch):
        self.outcomes: list = []
        self.ready_waits = 0
        real_open, real_ready = Client._open, grpc.channel_ready_future

        def _open(client, *a):
            try:
                info = real_open(client, *a)
            except errors.OrbitKVError as e:
                self.outcomes.append(e)
                raise
            self.outcomes.append(info)
            return info

        def ready(channel):
            self.ready_waits += 1
            return real_ready(channel)

        monkeypatch.setattr(Client, "_open", _open)
        monkeypatch.setattr(grpc, "channel_ready_future", ready)

    def none_waited(self) -> bool:
        """At least one attempt, all refused at once, and no wait for the socket."""
        return self.ready_waits == 0 and bool(self.outcomes) and \
            all(isinstance(o, errors.PeerUnavailable) for o in self.outcomes)


class SteppedClock:
    """Stands in for the time module in orbitkv.client, whose monotonic time
    paces a lost session's open attempts: it stands still (at the real time it
    was made) and moves only by advance(), until thaw() lets it follow the real
    clock again (never going back)."""

    def __init__(self):
        self.t, self.frozen = time.monotonic(), True

    def monotonic(self) -> float:
        return self.t if self.frozen else max(self.t, time.monotonic())

    def advance(self, s: float) -> None:
        self.t += s

    def thaw(self) -> None:
        self.frozen = False


def test_lazy_client_opens_its_session_once_the_peer_appears(late_peer, monkeypatch):
    opens = Opens(monkeypatch)
    clock = SteppedClock()
    monkeypatch.setattr(client_mod, "time", clock)
    c, err = guarded(lambda: Client(late_peer.socket, timeout=2, lazy=True), "a lazy client with the peer down")
    assert err is None, err
    try:
        s, err = guarded(lambda: c.open_lookup_session(_layout(), block_tokens=BS, lazy=True),
                         "a lazy open with the peer down")
        assert err is None, err
        # Neither waited for the peer: one open attempt, refused at once.
        assert opens.none_waited() and len(opens.outcomes) == 1, (opens.outcomes, opens.ready_waits)
        assert not s.ready and s.lost is not None and not c.reachable
        # Calls fail fast and open attempts are rate-limited: one per
        # RETRY_INTERVAL_S of the session's clock, whatever the number of
        # calls and keepalive ticks (foreground calls and the keepalive
        # thread both retry).
        for _ in range(50):
            with pytest.raises(errors.SessionLost):
                s.lookup([b"\x01" * 16])
        assert len(opens.outcomes) == 1, opens.outcomes
        clock.advance(client_mod.RETRY_INTERVAL_S)
        for _ in range(50):
            with pytest.raises(errors.SessionLost):
                s.lookup([b"\x01" * 16])
        wait_until(lambda: len(opens.outcomes) >= 2, 10, "an open attempt once the retry interval passed")
        for _ in range(50):
            with pytest.raises(errors.SessionLost):
                s.lookup([b"\x01" * 16])
        assert len(opens.outcomes) == 2 and opens.none_waited(), opens.outcomes
        clock.thaw()
        late_peer.start()
        wait_until(lambda: s.ready, UP_WITHIN_S, "session opened after the peer started")
        assert s.id and s.generation == 1 and c.reachable
        assert s.lookup([b"\x01" * 16]).hit_pages == 0
    finally:
        c.close()


def _pending(sock: str) -> int:
    """Connections the kernel accepted on the peer's listening socket that
    the peer has not taken yet (the listener's Recv-Q, from ss)."""
    out = subprocess.run(["ss", "-xlnH", "src", sock], capture_output=True, text=True, timeout=10, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if sock in f:
            return int(f[f.index("LISTEN") + 1])
    raise AssertionError(f"no listening socket {sock} in ss's output: {out!r}")


def test_a_busy_peer_is_waited_for_while_a_session_opens(real_peer):
    """Issue 33: a peer that has accepted the engine's connection but does not
    answer yet (busy; here paused with SIGSTOP) is waited for up to
    connect_timeout, not reported unreachable: the session opens once the
    peer answers. (gRPC takes min_reconnect_backoff_ms as its connect timeout;
    at 100 ms the open gave up and the engine ran without the cache.)"""
    c = Client(real_peer.socket, timeout=2, connect_timeout=30, lazy=True)
    opened: dict = {}
    opener = threading.Thread(target=lambda: opened.update(s=c.open_lookup_session(_layout(), block_tokens=BS,
                                                                                     lazy=True)), daemon=True)
    real_peer.proc.send_signal(signal.SIGSTOP)
    try:
        assert _pending(real_peer.socket) == 0
        opener.start()
        wait_until(lambda: _pending(real_peer.socket) == 1, 10, "the paused peer's socket accepted the connection")
        opener.join(BUSY_S)  # the peer stays busy a while longer
        waited = opener.is_alive()
    finally:
        real_peer.proc.send_signal(signal.SIGCONT)
    opener.join(30)
    try:
        assert not opener.is_alive(), "the open did not return within its deadline"
        s = opened["s"]
        assert s.ready and s.id and s.lost is None and c.reachable, s.lost
        assert waited, "the open gave up while the peer was busy"
        assert s.lookup([b"\x01" * 16]).hit_pages == 0
    finally:
        c.close()


def test_lazy_open_still_raises_a_refusal(tmpdir_short):
    fp = FakePeer(tmpdir_short + "/f.sock")
    try:
        with Client(fp.socket, lazy=True) as c:
            with pytest.raises(errors.InvalidRequest, match="dtype"):
                c.open_lookup_session(keys.Layout("m", "r", "int3", L, H, D, 0, 1, PT, "vllm-flash"),
                                      block_tokens=BS, lazy=True)
    finally:
        fp.stop()


def _forward(e, blocks):
    def f():
        for t in e.kv.values():
            t[:, blocks] = torch.randn(t[:, blocks].shape)
    return f


def test_vllm_connector_starts_without_the_peer_and_picks_it_up(late_peer, monkeypatch):
    with shm_pool(pool_bytes(L, NB, BS, H, D)) as (path, pool):
        opens = Opens(monkeypatch)
        e, err = guarded(lambda: Engine(late_peer.socket, flash_layers(pool, L, NB, BS, H, D)),
                         "the connector's construction with the peer down")
        assert err is None, err
        try:
            # Construction did not wait for the peer: its opens were refused at once.
            assert opens.none_waited(), (opens.outcomes, opens.ready_waits)
            assert not e.sched.scheduler.backend.available and not e.work.worker.session.ready
            # Peer down: a miss (not None: the gate holds nothing), no loads, no saves, no delayed free.
            a = Request("a", list(range(3 * PT + 1)))
            blocks = list(range(0, 7))
            assert e.sched.get_num_new_matched_tokens(a, 0) == (0, False)
            e.sched.update_state_after_alloc(a, (blocks,), 0)
            so = SchedulerOutput([NewRequestData("a", a.prompt_token_ids, (blocks,), 0)],
                                 num_scheduled_tokens={"a": len(a.prompt_token_ids)})
            meta, res, errs = e.step(so, before_save=_forward(e, blocks))
            assert meta.loads == [] and meta.saves == [] and not errs
            assert e.sched.request_finished(a, blocks) == (False, None)
            # A save the scheduler planned while the worker cannot reach the
            # peer is skipped and reported done at once (delayed free ends).
            w = e.work.worker
            spec = SaveSpec("x", 0, {0: keys.chain(_layout().fingerprint(), PT, list(range(PT)))}, [(0, 1)])
            w.wait_for_save(OrbitKVMetadata(saves=[spec]))
            assert w.get_results(["x"])[0] == {"x"} and w.skipped_saves == 1

            late_peer.start()
            wait_until(lambda: e.sched.scheduler.backend.available and w.session.ready, UP_WITHIN_S,
                       "scheduler and worker sessions opened")
            # Caching resumes: the same prompt is saved, then a request sharing it hits.
            a2 = Request("a2", a.prompt_token_ids)
            _compute_and_save(e, a2, list(range(0, 7)))
            b = Request("b", a.prompt_token_ids[: 3 * PT] + [9, 9, 9])
            n, is_async = e.sched.get_num_new_matched_tokens(b, 0)
            assert (n, is_async) == (3 * PT, True)
            b_blocks = list(range(10, 17))
            e.sched.update_state_after_alloc(b, (b_blocks,), n)
            e.step(SchedulerOutput())
            _, recving, failed, errs = e.idle_until(lambda s, r: "b" in r)
            assert not failed and not errs
            assert e.blocks_bytes(b_blocks[:6]) == e.blocks_bytes(list(range(0, 6)))
        finally:
            e.close()


def test_sglang_backend_starts_without_the_peer_and_picks_it_up(late_peer, monkeypatch):
    from tests.test_sglang_backend import _backend, _hashes, host_pool

    with host_pool("layer_first", 64, shared=True) as hp:
        opens = Opens(monkeypatch)

        def construct():
            be = _backend(late_peer.socket)
            be.register_mem_pool_host(hp)
            return be

        be, err = guarded(construct, "the backend's construction with the peer down")
        assert err is None, err
        try:
            # Construction did not wait for the peer: its opens were refused at once.
            assert opens.none_waited() and not be.available, (opens.outcomes, opens.ready_waits)
            ks = _hashes(4, "down")
            idx = torch.arange(0, 4 * 4, dtype=torch.int64)
            assert be.batch_exists(ks) == 0 and not be.exists(ks[0])
            assert be.batch_set_v1(ks, idx) == [False] * 4
            assert be.batch_get_v1(ks, torch.arange(32, 48, dtype=torch.int64)) == [False] * 4
            late_peer.start()
            wait_until(lambda: be.available, UP_WITHIN_S, "backend session opened")
            assert be.batch_set_v1(ks, idx) == [True] * 4
            assert be.batch_exists(ks) == 4
            assert be.batch_get_v1(ks, torch.arange(32, 48, dtype=torch.int64)) == [True] * 4
            assert hp.page_bytes(8) == hp.page_bytes(0)
        finally:
            be.close()


def test_refengine_serves_without_the_peer_then_restores(tmpdir_short):
    from tests.test_e2e_restore import FILLER_TOKENS, KV_TOKENS, PAGE, PROMPT_TOKENS, loaded, settled, tokens

    peer = real_peer_handle(tmpdir_short)  # skips (saying why) without ORBITKV_BIN
    eng = None
    try:
        extra = {"timeout_s": 2, "load_deadline_ms": 10000, "save_deadline_ms": 10000}
        eng = start_refengine(tmpdir_short, "engine", "--kv-tokens", str(KV_TOKENS), "--connector", "orbitkv",
                              "--orbitkv-socket", peer.socket, "--connector-extra", json.dumps(extra))
        prompt, filler = tokens(PROMPT_TOKENS, 11), tokens(FILLER_TOKENS, 12)
        down = eng.complete(prompt, 8)  # its HTTP timeout is the hang guard
        assert down["usage"]["orbitkv_restored_tokens"] == 0
        # Served without waiting on the peer: both clients' opens were
        # refused at once (UNAVAILABLE, not a deadline run out), the
        # connector claimed none of the prompt (no load to wait for), and no
        # lookup, load or save was tried (none failed or ran out its deadline).
        log = eng.log_tail(20000)
        assert log.count("unreachable (open session: UNAVAILABLE") == 2, log
        m = eng.metrics()
        assert m["orbitkv_refengine_external_query_tokens_total"] > 0, m
        assert m["orbitkv_refengine_external_matched_tokens_total"] == 0, m
        for tried in ("orbitkv lookup for", "orbitkv load for", "orbitkv save for", "after its deadline"):
            assert tried not in log, log

        peer.start()
        wait_until(lambda: peer.metrics().get("orbitkv_fabric_sessions") == 2, UP_WITHIN_S + 5,
                   "engine sessions opened after the peer started")
        again = eng.complete(prompt, 8)  # local prefix hit; its pages are saved now
        assert again["choices"][0]["token_ids"] == down["choices"][0]["token_ids"]
        eng.complete(filler, 8)  # pushes the prompt out of the engine's pool
        wait_until(lambda: settled(peer, eng), 20, "saves done, gauges at 0")
        warm = eng.complete(prompt, 8)
        restored = PROMPT_TOKENS // PAGE * PAGE
        assert warm["usage"]["orbitkv_restored_tokens"] == restored, eng.log_tail()
        assert loaded(peer.metrics()) == restored
        assert warm["choices"][0]["token_ids"] == down["choices"][0]["token_ids"]
        log = eng.log_tail(100000)
        # once per transition and client (the scheduler's and the worker's), not per call
        assert log.count("unreachable") == 2 and log.count("reachable again") == 2, log
        print("\n" + log[-3000:])
    finally:
        if eng is not None:
            eng.stop()
        peer.stop()
