"""The engine lane (orbitkv.lane): engine calls on the peer's plain-frame
socket beside gRPC, with gRPC's answers and errors, a fallback to gRPC
while the lane cannot be reached, and no answer read by the wrong call."""

from __future__ import annotations

import os
import signal

import pytest

from orbitkv import errors, keys
from orbitkv.client import Client
from tests.fixtures import wait_until

PT = 16


def _layout():
    return keys.Layout("orbitkv/test", "r0", "fp32", 2, 2, 16, 0, 1, PT, "vllm-flash")


class _NoGRPC:
    """A stub whose every method fails the test: calls must use the lane."""

    def __getattr__(self, name):
        def refuse(*a, **kw):
            raise AssertionError(f"{name} went over gRPC")
        return refuse


def _lookups(c: Client):
    return c.open_lookup_session(_layout(), block_tokens=PT)


def test_engine_calls_go_over_the_lane_and_answer_as_grpc(real_peer):
    lane_c, grpc_c = Client(real_peer.socket), Client(real_peer.socket, use_lane=False)
    try:
        ls, gs = _lookups(lane_c), _lookups(grpc_c)
        ks = [os.urandom(16) for _ in range(4)]
        lane_c.stub = _NoGRPC()  # the session is open; every call from here on is the lane's
        got = ls.lookup(ks, lease=True)
        assert (got.hit_pages, got.dram) == (0, 0) == (gs.lookup(ks).hit_pages, 0)
        with pytest.raises(errors.NotFound) as lane_err:
            ls.release("no-such-lease")
        with pytest.raises(errors.NotFound) as grpc_err:
            gs.release("no-such-lease")
        assert str(lane_err.value).split(": ", 1)[1] == str(grpc_err.value).split(": ", 1)[1], "the same error"
        m = real_peer.metrics()
        assert m['orbitkv_fabric_rpcs_total{code="NotFound",method="Release"}'] == 2, "the lane's calls are counted"
    finally:
        lane_c.close()
        grpc_c.close()


def test_without_a_lane_calls_use_grpc(real_peer):
    """An older peer, or one whose socket path left no room for the lane's:
    the lane refuses the connection and the call goes over gRPC."""
    os.unlink(real_peer.socket + ".lane")
    c = Client(real_peer.socket)
    try:
        s = _lookups(c)
        assert s.lookup([os.urandom(16)]).hit_pages == 0
        assert c.reachable
    finally:
        c.close()


def test_a_paused_peer_times_out_and_its_late_answer_is_never_read(real_peer):
    """A call the peer does not answer within its deadline raises PeerTimeout
    (the peer is slow, not gone), and its connection is dropped: when the
    peer wakes, the next call gets its own answer, not the late one."""
    c = Client(real_peer.socket, timeout=0.5)
    try:
        s = _lookups(c)
        held = os.urandom(16)
        s.lookup([held])  # a pooled connection, now idle
        real_peer.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(errors.PeerTimeout):
                s.lookup([held], lease=True)
        finally:
            real_peer.proc.send_signal(signal.SIGCONT)
        assert c.reachable, "a peer that is slow is not reported unreachable"
        with pytest.raises(errors.NotFound):  # a late lookup's answer would have a lease and no error
            s.release("no-such-lease")
    finally:
        c.close()


def test_a_restarted_peer_is_reached_again(real_peer):
    """Idle connections to a peer that restarted are dropped, not used: calls
    after the restart reach the new peer, on the lane again (within the
    lane's retry interval, if a call found it down meanwhile)."""
    c = Client(real_peer.socket)
    try:
        s = _lookups(c)
        s.lookup([os.urandom(16)])
        real_peer.proc.send_signal(signal.SIGTERM)
        real_peer.proc.wait(30)
        real_peer.start()
        assert s.lookup([os.urandom(16)]).hit_pages == 0, "answered after the restart (the session reopened)"
        answered = _count_lane_answers(c)
        wait_until(lambda: s.lookup([os.urandom(16)]).hit_pages == 0 and answered, 10,
                   "a lookup answered on the lane after the restart")
        assert c.reachable
    finally:
        c.close()


def _count_lane_answers(c: Client) -> list:
    """A list that grows by one for every call the lane answers."""
    answered, call = [], c._lane.call

    def counted(*a, **kw):
        out = call(*a, **kw)
        answered.append(a[1])
        return out
    c._lane.call = counted
    return answered
