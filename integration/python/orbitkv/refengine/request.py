"""A request as the scheduler and the KV connector see it (the attributes vLLM's Request has)."""

from __future__ import annotations

import enum
import time
import types
from typing import Any, Dict, List, Optional

from .blocks import extend_block_hashes


class RequestStatus(enum.IntEnum):
    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 10
    FINISHED_LENGTH = 11
    FINISHED_ABORTED = 12
    FINISHED_ERROR = 13

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """One completion request. Token lists are plain Python ints."""

    def __init__(self, request_id: str, prompt_token_ids: List[int], max_tokens: int,
                 block_size: int, kv_transfer_params: Optional[Dict[str, Any]] = None):
        if not prompt_token_ids:
            raise ValueError("empty prompt")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: List[int] = []
        self.all_token_ids: List[int] = list(prompt_token_ids)
        self.max_tokens = max_tokens
        self.sampling_params = types.SimpleNamespace(max_tokens=max_tokens, temperature=0.0)
        self.block_size = block_size
        self.block_hashes: List[bytes] = []
        extend_block_hashes(self.block_hashes, self.all_token_ids, block_size)
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1             # local prefix-cache hit at first admission (set once)
        self.local_hit_tokens = 0               # local prefix-cache hit at the latest admission
        self.num_external_computed_tokens = 0   # external tokens asked for at the last admission
        self.restored_tokens = 0                # external tokens actually restored (all admissions)
        self.first_restored_tokens = 0          # of which before any preemption
        self.num_preemptions = 0
        self.kv_transfer_params = kv_transfer_params
        self.kv_transfer_params_out: Optional[Dict[str, Any]] = None
        self.arrival_time = time.monotonic()
        self.first_token_time: Optional[float] = None
        self.error: Optional[str] = None

    # vLLM names -------------------------------------------------------------------------
    @property
    def req_id(self) -> str:
        return self.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_publishable_block_hashes(self) -> int:
        return len(self.block_hashes)

    def is_finished(self) -> bool:
        return self.status.finished

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        extend_block_hashes(self.block_hashes, self.all_token_ids, self.block_size)

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
