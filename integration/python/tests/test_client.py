"""Client and data path against a peer: the in-process fake always, the real
Go peer when ORBITKV_BIN names it."""

import glob
import threading

import pytest
import torch

from orbitkv import buffers, errors, keys
from orbitkv.client import Client, ControlSession, Durability, PageCode, PageRef
from tests.fakepeer import FakePeer
from tests.fixtures import wait_until
from tests.shm import flash_layers, pool_bytes, shm_pool

L, NB, BS, H, D, PT = 2, 16, 4, 2, 8, 8  # 2 blocks per page


def _layout(model="orbitkv/test"):
    return keys.Layout(model, "r0", "fp32", L, H, D, 0, 1, PT, "vllm-flash")


@pytest.fixture
def engine(peer):
    with shm_pool(pool_bytes(L, NB, BS, H, D)) as (path, pool):
        pool.copy_(torch.randint(0, 255, pool.shape, dtype=torch.uint8))
        kv = flash_layers(pool, L, NB, BS, H, D)
        desc = buffers.describe_planes(buffers.vllm_planes(kv))
        client = Client(peer.socket, timeout=5)
        sess = client.open_session(
            _layout(), block_tokens=BS, num_blocks=NB, buffers=desc.buffers, segments=desc.segments, engine_id="test"
        )
        yield peer, client, sess, kv
        client.close()


def _block_bytes(kv, b):
    return b"".join(t[p, b].contiguous().flatten().view(torch.uint8).numpy().tobytes() for t in kv.values() for p in (0, 1))


def test_save_lookup_load_byte_exact(engine):
    peer, client, sess, kv = engine
    fp = sess.layout.fingerprint()
    assert sess.info.fingerprint in (b"", fp)
    assert sess.info.page_bytes == 2 * L * 2 * BS * H * D * 4
    ks = keys.chain(fp, PT, list(range(3 * PT)))
    src = [(0, 1), (2, 3), (4, 5)]
    res = sess.save([PageRef(k, b) for k, b in zip(ks, src)]).wait(10)
    assert res.done and res.ok, res
    lk = sess.lookup(ks + [b"\x01" * 16], lease=True)
    assert lk.hit_pages == 3 and lk.lease_id
    assert lk.dram + lk.ssd + lk.remote == 3
    dst = [(10, 11), (12, 9), (14, 15)]  # blocks need not be consecutive ids
    res = sess.load([PageRef(k, b) for k, b in zip(ks, dst)], lease_id=lk.lease_id).wait(10)
    assert res.ok, res
    for s, d in zip(src, dst):
        for sb, db in zip(s, d):
            assert _block_bytes(kv, sb) == _block_bytes(kv, db)
    sess.release(lk.lease_id)


def test_lookup_leases_only_past_the_engines_own_pages(engine):
    """lease_from: the hit counts the pages the engine holds, the lease (and the
    tier counts) only those after them; nothing past the hit is leased."""
    peer, client, sess, kv = engine
    ks = keys.chain(sess.layout.fingerprint(), PT, list(range(300, 300 + 3 * PT)))
    assert sess.save([PageRef(k, (2 * i, 2 * i + 1)) for i, k in enumerate(ks)]).wait(10).ok
    lk = sess.lookup(ks, lease=True, lease_from=2)
    assert (lk.hit_pages, lk.dram + lk.ssd, bool(lk.lease_id)) == (3, 1, True)
    res = sess.load([PageRef(ks[2], (6, 7))], lease_id=lk.lease_id).wait(10)
    assert res.ok, res
    sess.release(lk.lease_id)
    held = sess.lookup(ks, lease=True, lease_from=3)  # the engine holds the whole hit
    assert (held.hit_pages, held.lease_id) == (3, "")


def test_per_page_codes_and_lookup_misses(engine):
    peer, client, sess, kv = engine
    fp = sess.layout.fingerprint()
    ks = keys.chain(fp, PT, list(range(100, 100 + 2 * PT)))
    assert sess.save([PageRef(ks[0], (0, 1))]).wait(10).ok
    assert sess.lookup(ks).hit_pages == 1
    assert sess.lookup(ks[1:]).hit_pages == 0
    res = sess.load([PageRef(ks[0], (6, 7)), PageRef(ks[1], (8, 9))]).wait(10)
    assert res.done
    assert res.pages[0].code == PageCode.OK
    assert res.pages[1].code == PageCode.NOT_FOUND
    assert res.failed_indices() == [1]


def test_release_twice_and_unknown_lease(engine):
    peer, client, sess, kv = engine
    ks = keys.chain(sess.layout.fingerprint(), PT, list(range(200, 200 + PT)))
    assert sess.save([PageRef(ks[0], (0, 1))]).wait(10).ok
    lk = sess.lookup(ks, lease=True)
    sess.release(lk.lease_id)
    with pytest.raises(errors.NotFound):
        sess.release(lk.lease_id)


def test_invalid_requests_map_to_invalid_argument(engine):
    peer, client, sess, kv = engine
    with pytest.raises(errors.InvalidRequest):
        sess.save([PageRef(b"\x00" * 16, (0,))])  # a page needs 2 blocks
    with pytest.raises(errors.InvalidRequest):
        sess.save([PageRef(b"\x00" * 16, (0, NB))])  # block out of range
    with pytest.raises(errors.InvalidRequest):
        sess.lookup([b"short"])


def test_close_stops_keepalive_and_is_idempotent(engine):
    peer, client, sess, kv = engine
    assert sess._keepalive.is_alive()
    sess.close()
    assert not sess._keepalive.is_alive()
    sess.close()
    with pytest.raises(errors.SessionLost):
        sess.lookup([b"\x00" * 16])


def test_control_session_is_lookup_only(peer):
    with Client(peer.socket) as c:
        ctl = ControlSession(c, _layout(), BS)
        assert ctl.session.info.page_bytes == 2 * L * PT * H * D * 4  # from the layout: no buffers
        assert ctl.lookup([b"\x02" * 16]).hit_pages == 0
        with pytest.raises(errors.FailedPrecondition):
            ctl.session.save([PageRef(b"\x02" * 16, (0, 1))])
        with pytest.raises(errors.FailedPrecondition):
            ctl.session.load([PageRef(b"\x02" * 16, (0, 1))])
        ctl.close()
    assert not glob.glob("/dev/shm/orbitkv-ctl-*")  # no dummy buffer file any more


def test_lookup_only_session_needs_a_known_dtype(peer):
    with Client(peer.socket) as c:
        with pytest.raises(errors.InvalidRequest, match="dtype"):
            c.open_lookup_session(keys.Layout("m", "r", "int3", L, H, D, 0, 1, PT, "vllm-flash"), block_tokens=BS)


def test_sessions_reopen_after_the_peer_restarts(engine):
    peer, client, sess, kv = engine
    ctl = ControlSession(client, _layout(), BS)
    fp = sess.layout.fingerprint()
    ks = keys.chain(fp, PT, list(range(300, 300 + 2 * PT)))
    assert sess.save([PageRef(k, (2 * i, 2 * i + 1)) for i, k in enumerate(ks)], durability=Durability.SSD).wait(20).ok
    op = sess.load([PageRef(ks[0], (8, 9))])
    old_ids = (sess.id, ctl.session.id)
    peer.restart()
    # The next call notices, opens the session again and retries: the pages
    # saved to SSD are found and loaded into the same registered buffers.
    lk = ctl.lookup(ks, lease=True)
    assert lk.hit_pages == 2 and lk.lease_id
    res = sess.load([PageRef(k, (10 + 2 * i, 11 + 2 * i)) for i, k in enumerate(ks)], lease_id=lk.lease_id).wait(10)
    assert res.ok, res
    assert _block_bytes(kv, 0) == _block_bytes(kv, 10) and _block_bytes(kv, 3) == _block_bytes(kv, 13)
    assert (sess.id, ctl.session.id) != old_ids and sess.generation == ctl.session.generation == 1
    with pytest.raises(errors.NotFound):  # an operation of the forgotten session
        op.wait(1)
    ctl.release(lk.lease_id)
    ctl.close()


HANG_GUARD_S = 60.0  # stops a hung call from hanging the suite; never a bound on how fast a call is


def guarded(fn, what, guard_s=HANG_GUARD_S):
    """Runs fn() in a thread: (its result, None) or (None, the exception it
    raised). A call still running after guard_s fails the test naming
    ``what``: a hang guard, not a speed bound."""
    out = {}

    def run():
        try:
            out["r"] = fn()
        except BaseException as e:  # handed to the test
            out["e"] = e

    t = threading.Thread(target=run, name=f"guarded: {what}", daemon=True)
    t.start()
    t.join(guard_s)
    assert not t.is_alive(), f"{what}: still running after the {guard_s:g} s hang guard"
    return out.get("r"), out.get("e")


def test_lost_peer_fails_fast_and_the_keepalive_reopens(tmpdir_short):
    fp = FakePeer(tmpdir_short + "/f.sock")
    c = Client(fp.socket, timeout=2)
    try:
        s = c.open_lookup_session(_layout(), block_tokens=BS)
        fp.restart()
        wait_until(lambda: s.generation == 1, 10, "the keepalive (every ~0.33 s) reopened the session")
        assert s.id in fp.sessions
        fp.stop()
        actions = []  # every RPC the client makes from here on (the keepalive's too)
        real_call = c.call
        c.call = lambda action, *a, **kw: actions.append(action) or real_call(action, *a, **kw)
        _, err = guarded(lambda: s.lookup([b"\x04" * 16]), "a lookup on a stopped peer")
        # Fails fast: one Lookup RPC, ended by the peer's refusal (or by its
        # own deadline), not retried and not waiting for a reopen.
        assert isinstance(err, (errors.PeerUnavailable, errors.PeerTimeout)), err
        assert actions.count("lookup") == 1 and "open session" not in actions, actions
        assert s.generation == 1
    finally:
        c.close()
        fp.stop()


def test_unreachable_socket(tmpdir_short):
    # A socket nobody serves: the client gives up once connect_timeout has
    # passed (its message says so), it does not wait on.
    _, err = guarded(lambda: Client(tmpdir_short + "/nobody.sock", connect_timeout=0.5), "connecting to no peer")
    assert isinstance(err, errors.PeerUnavailable) and "not ready within 0.5s" in str(err), err


def test_wait_timeout_returns_progress(tmpdir_short):
    fp = FakePeer(tmpdir_short + "/f.sock", delay_s=1.0)
    try:
        with shm_pool(pool_bytes(L, NB, BS, H, D)) as (path, pool):
            desc = buffers.describe_planes(buffers.vllm_planes(flash_layers(pool, L, NB, BS, H, D)))
            with Client(fp.socket) as c:
                s = c.open_session(_layout(), block_tokens=BS, num_blocks=NB, buffers=desc.buffers, segments=desc.segments)
                op = s.save([PageRef(b"\x03" * 16, (0, 1))])
                r = op.wait(0.1)
                assert not r.done and r.pages[0].code == PageCode.PENDING
                assert op.wait(10).ok
    finally:
        fp.stop()
