"""OrbitKVTier's worker in a process of its own (orbitkv.vllm_tier.worker),
under vLLM 0.33's own tiering manager and the real peer: where it runs, what
happens when it dies (held rows stay pinned, a new one serves), and that it
ends with vLLM's process. The thread worker (option worker "thread") is the
same Link in vLLM's process; it answers byte for byte too.

Skips without vLLM 0.33; `make test-vllm033` runs it with ORBITKV_REQUIRE=vllm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

if os.environ.get("ORBITKV_REQUIRE") != "vllm":
    pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm033 runs this in its vLLM environment)")
pytest.importorskip("vllm.v1.kv_offload.tiering.base", reason="this vLLM has no secondary-tier interface (0.33 has)")

from vllm.v1.kv_offload.base import LookupResult, ReqContext  # noqa: E402

from orbitkv.vllm_tier.link import Link  # noqa: E402
from orbitkv.vllm_tier.worker import ProcessLink  # noqa: E402
from tests.fixtures import start_real_peer  # noqa: E402
from tests.vtier_harness import ABANDON_S, BOUND_S, FAST, Engine, keys_for, row_bytes, tier_entry  # noqa: E402

HIT, MISS = LookupResult.HIT, LookupResult.MISS
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _until(cond, what="condition"):
    end = time.monotonic() + BOUND_S
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} not reached in {BOUND_S}s")


def _exited(pid: int) -> bool:
    """Gone, or a zombie nobody reaps (re-parented in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def engines():
    made = []

    def make(socket, **kw):
        e = Engine(tier_entry(socket, **kw))
        made.append(e)
        _until(lambda: e.tier._link.ready, "the tier's sessions open")
        return e

    yield make
    for e in made:
        e.close()


def _round_trip(a, b, keys):
    assert a.store(keys) == keys
    a.settle(BOUND_S)
    answers, ctx = b.lookup(keys, BOUND_S)
    assert answers == [HIT] * len(keys)
    rows = b.read(keys, ctx)
    assert all(np.array_equal(r, row_bytes(k)) for k, r in zip(keys, rows))
    b.finish(ctx)


@pytest.mark.parametrize("worker, kind", [("auto", ProcessLink), ("process", ProcessLink), ("thread", Link)])
def test_each_worker_answers_byte_exact(real_peer, engines, worker, kind):
    a, b = engines(real_peer.socket, worker=worker), engines(real_peer.socket, worker=worker)
    assert isinstance(a.tier._link, kind)
    assert a.tier.mode == "zero-copy stores"
    if kind is ProcessLink:
        assert a.tier._link.pid not in (None, os.getpid()) and not _exited(a.tier._link.pid)
    _round_trip(a, b, keys_for(60, 9))


def test_an_unknown_worker_is_refused(real_peer):
    with pytest.raises(ValueError, match="worker must be one of"):
        Engine(tier_entry(real_peer.socket, worker="fork"))


def test_close_ends_the_worker_process(real_peer):
    e = Engine(tier_entry(real_peer.socket))
    pid = e.tier._link.pid
    assert pid is not None and not _exited(pid)
    e.close()
    assert _exited(pid)


def test_worker_killed_mid_store_keeps_its_rows_pinned_then_a_new_one_serves(tmpdir_short, engines):
    """The worker dies while the peer (frozen) may still read a store's rows
    from vLLM's pool: the store stays open past its abandon time, however
    often vLLM steps; a new worker adopts it and ends it once the peer answers
    again; then the tier serves byte for byte."""
    peer = start_real_peer(tmpdir_short)
    try:
        a, b = engines(peer.socket, **FAST), engines(peer.socket, **FAST)
        first = a.tier._link.pid
        peer.proc.send_signal(signal.SIGSTOP)
        try:
            a.store(keys_for(61, 3))
            _until(lambda: (a.step(), a.tier._link._jobs)[1], "the store sent to the worker")
            os.kill(first, signal.SIGKILL)
            deadline = time.monotonic() + 2 * ABANDON_S + 1.0
            while time.monotonic() < deadline:  # held throughout
                a.step()
                assert not a.idle()
                time.sleep(0.05)
            assert a.tier._link.pid not in (None, first)  # a new worker adopted it
        finally:
            peer.proc.send_signal(signal.SIGCONT)
        a.settle(BOUND_S)
        _until(lambda: a.tier._link.ready, "the new worker's sessions open")
        _round_trip(a, b, keys_for(62, 5))
    finally:
        peer.stop()


def test_lookups_owed_by_a_dead_worker_are_answered_absent(real_peer, engines):
    """Lookups the worker took and never answered end as misses, not as a
    request waiting forever; the next worker answers them again."""
    a, b = engines(real_peer.socket, **FAST), engines(real_peer.socket, **FAST)
    ks = keys_for(63, 4)
    a.store(ks)
    a.settle(BOUND_S)
    link = b.tier._link
    os.kill(link.pid, signal.SIGSTOP)  # it takes the lookup and never answers
    pid = link.pid
    try:
        m, ctx = b.manager, ReqContext("owed")
        with m.lock:
            m.on_new_request(ctx)
            [m.lookup(k, ctx) for k in ks]
        b.step()  # the probe goes to the stopped worker
        _until(lambda: link._lookups, "the probe sent to the worker")
    finally:
        os.kill(pid, signal.SIGKILL)
    _until(lambda: not link._lookups and not link.results.empty(), "the owed lookup answered")
    with m.lock:
        answers = [m.lookup(k, ctx) for k in ks]
        m.on_request_finished(ctx)
    assert answers[0] == MISS  # absent: vLLM recomputes
    _until(lambda: link.ready and link.pid != pid, "a new worker")
    answers, ctx = b.lookup(ks, BOUND_S)
    assert answers == [HIT] * len(ks)
    b.finish(ctx)


def test_the_worker_ends_when_vllms_process_is_killed(real_peer, tmp_path):
    """vLLM's engine core killed with SIGKILL: its worker process notices
    (its socket closes, or it is re-parented) and exits."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {HERE!r})
        from tests.vtier_harness import Engine, tier_entry
        e = Engine(tier_entry({real_peer.socket!r}))
        print(e.tier._link.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        assert not _exited(pid)
    finally:
        proc.kill()
        proc.wait()
    _until(lambda: _exited(pid), "the worker's exit")


def test_a_worker_process_that_cannot_start_leaves_the_thread(real_peer, engines, monkeypatch, caplog):
    """"auto" falls back to the thread worker, which serves, and shuts down
    letting vLLM unmap its pool; "process" refuses to start, with the reason."""
    import logging

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the child exits before its hello
    a, b = engines(real_peer.socket), engines(real_peer.socket)
    assert isinstance(a.tier._link, Link) and isinstance(b.tier._link, Link)
    _round_trip(a, b, keys_for(64, 4))
    a.close()
    assert not [r for r in caplog.records if "still exported" in r.getMessage()]
    with pytest.raises(ValueError, match="worker is 'process' but the tier's worker process"):
        Engine(tier_entry(real_peer.socket, worker="process"))
