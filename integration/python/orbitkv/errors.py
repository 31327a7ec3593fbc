"""Exceptions raised by the OrbitKV adapters, and the one table that maps
gRPC status codes onto them."""

from __future__ import annotations

from typing import Any


class OrbitKVError(Exception):
    """Base of every OrbitKV adapter error. ``code`` is the gRPC status code
    name when the error came from the peer ("" otherwise)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class PeerUnavailable(OrbitKVError):
    """The peer's socket cannot be reached (not running, restarting)."""


class PeerTimeout(OrbitKVError):
    """A call's deadline passed before the peer answered."""


class InvalidRequest(OrbitKVError):
    """The peer rejected the request's arguments (InvalidArgument)."""


class NotFound(OrbitKVError):
    """The session, lease or operation is unknown to the peer (expired or
    already released)."""


class BudgetExceeded(OrbitKVError):
    """A hard budget (query bytes, capacity) refused the call."""


class FailedPrecondition(OrbitKVError):
    """The peer's state does not allow the call (e.g. closed session)."""


class SessionLost(OrbitKVError):
    """The session expired or was closed; its leases are gone."""


class BufferError_(OrbitKVError):
    """A KV tensor cannot be described as a peer-visible buffer."""


class NotFileBacked(BufferError_):
    """The tensor's memory is not a shared file mapping the peer can open."""


_CODE_TABLE: dict[str, type[OrbitKVError]] = {
    "UNAVAILABLE": PeerUnavailable,
    "DEADLINE_EXCEEDED": PeerTimeout,
    "INVALID_ARGUMENT": InvalidRequest,
    "OUT_OF_RANGE": InvalidRequest,
    "NOT_FOUND": NotFound,
    "RESOURCE_EXHAUSTED": BudgetExceeded,
    "FAILED_PRECONDITION": FailedPrecondition,
}


def from_rpc_error(action: str, err: Any) -> OrbitKVError:
    """Converts a grpc.RpcError raised while doing ``action`` into the
    matching OrbitKVError."""
    try:
        code = err.code().name
        details = err.details() or ""
    except Exception:  # not a call error (e.g. a channel failure)
        code, details = "UNKNOWN", str(err)
    return from_code(action, code, details)


def from_code(action: str, code: str, details: str) -> OrbitKVError:
    """The OrbitKVError of a peer's answer with gRPC code ``code`` (its
    name) and ``details``, over gRPC or the engine lane."""
    cls = _CODE_TABLE.get(code, OrbitKVError)
    return cls(f"{action}: {code}: {details}", code)
