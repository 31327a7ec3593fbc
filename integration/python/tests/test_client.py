"""Client and data path against a peer: the in-process fake always, the real
Go peer when ORBITKV_BIN names it."""

import time

import pytest
import torch

from orbitkv import buffers, errors, keys
from orbitkv.client import Client, ControlSession, PageCode, PageRef
from tests.fakepeer import FakePeer
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


def test_control_session_for_lookups(peer):
    with Client(peer.socket) as c:
        ctl = ControlSession(c, _layout(), BS)
        assert ctl.lookup([b"\x02" * 16]).hit_pages == 0
        ctl.close()


def test_control_session_falls_back_to_dummy_buffer(tmpdir_short):
    fp = FakePeer(tmpdir_short + "/f.sock", require_buffers=True)
    try:
        with Client(fp.socket) as c:
            ctl = ControlSession(c, _layout(), BS)
            assert ctl._dummy is not None
            assert ctl.lookup([b"\x02" * 16]).hit_pages == 0
            ctl.close()
            assert ctl._dummy is None
    finally:
        fp.stop()


def test_unreachable_socket(tmpdir_short):
    t0 = time.monotonic()
    with pytest.raises(errors.PeerUnavailable):
        Client(tmpdir_short + "/nobody.sock", connect_timeout=0.5)
    assert time.monotonic() - t0 < 5


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
