"""One request as vLLM 0.33.0's scheduler sees it (``v1/request.py``), plus the counters the
simulation reports about it."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Final


class RequestStatus(IntEnum):
    """vLLM's ``RequestStatus``: numbered from 1; finished when greater than PREEMPTED."""

    WAITING = 1
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = 2
    WAITING_FOR_REMOTE_KVS = 3
    WAITING_FOR_STREAMING_REQ = 4
    RUNNING = 5
    PREEMPTED = 6
    FINISHED_STOPPED = 7
    FINISHED_LENGTH_CAPPED = 8
    FINISHED_ABORTED = 9
    FINISHED_IGNORED = 10
    FINISHED_ERROR = 11
    FINISHED_REPETITION = 12

    @staticmethod
    def is_finished(status: int) -> bool:
        return status > RequestStatus.PREEMPTED


# The states the simulation uses, as plain int constants: compiled code inlines them, where
# reading an enum member is a lookup in the module's globals at every use.
WAITING: Final = 1
RUNNING: Final = 5
PREEMPTED: Final = 6
FINISHED_LENGTH_CAPPED: Final = 8
assert (WAITING, RUNNING, PREEMPTED, FINISHED_LENGTH_CAPPED) == (
    RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED,
    RequestStatus.FINISHED_LENGTH_CAPPED)

# Block keys stand in for vLLM's chained block hashes (docs/scheduler.md#kv-keys). A key is an int:
# blocks that lie wholly inside a prefix group's shared prefix get the group's key for that block
# index (negative), every other block gets a key unique to (request, block index) (positive). Two
# blocks share a key exactly when vLLM's chained sha256 hashes would be equal.
KEY_SHIFT: Final = 32


# Shared by every request that holds no block / has no such time yet: a million-request run
# keeps every request, so one object each for these would cost ~150 bytes a request.
NO_BLOCKS: tuple[int, ...] = ()
_NAN = float("nan")


class Request:
    """A request: vLLM's scheduling state plus what the outputs report about it.

    ``arrival_time`` is the submission index, as the reference harness sets it; only the
    PRIORITY policy reads it (victim choice and heap order).
    """

    __slots__ = (
        "request_id", "position", "num_prompt_tokens", "max_tokens", "priority",
        "prefix_group", "prefix_len", "arrival_step", "arrival_time_s",
        "arrival_time", "status", "num_tokens", "num_computed_tokens", "num_output_tokens",
        "num_preemptions", "blocks", "num_cached_blocks", "is_prefill_chunk", "hwm",
        "key_base", "group_key_base", "num_shared_blocks",
        "submit_step", "first_sched_step", "first_token_step", "finish_step",
        "recomputed_tokens", "scheduled_tokens", "prefix_hit_tokens_at_admission",
        "submit_time_s", "first_token_time_s", "finish_time_s", "last_token_time_s",
        "itl_max_s", "num_itl", "lz_d0", "lz_seq", "grant", "grant_mark",
    )

    def __init__(
        self,
        request_id: str,
        prompt_len: int,
        output_len: int,
        *,
        position: int = 0,
        priority: int = 0,
        prefix_group: str | None = None,
        prefix_len: int = 0,
        group_index: int = -1,
        block_size: int = 16,
        arrival_step: int = 0,
        arrival_time_s: float | None = None,
        keyed: bool = True,
    ) -> None:
        """``keyed=False``: the run has no prefix cache, so no block key is ever asked for
        (``key_base`` then takes no memory of its own)."""
        self.request_id = request_id
        self.position = position
        self.num_prompt_tokens = prompt_len
        self.max_tokens = output_len
        self.priority = priority
        self.prefix_group = prefix_group
        self.prefix_len = prefix_len if prefix_group is not None else 0
        self.arrival_step = arrival_step
        self.arrival_time_s = arrival_time_s
        self.key_base = (position + 1) << KEY_SHIFT if keyed else 0
        if prefix_group is not None and group_index >= 0:
            self.group_key_base = -((group_index + 1) << KEY_SHIFT)
            self.num_shared_blocks = self.prefix_len // block_size
        else:
            self.group_key_base = 0
            self.num_shared_blocks = 0
        self.reset()

    def reset(self) -> None:
        """Back to the state of a request that was never submitted."""
        self.arrival_time = -1
        self.status = WAITING
        self.num_tokens = self.num_prompt_tokens
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_preemptions = 0
        # A list while the request holds blocks (admission makes a new one), else the
        # shared empty tuple: typed Any, as a union would need narrowing at every append.
        self.blocks: Any = NO_BLOCKS
        self.num_cached_blocks = 0
        self.is_prefill_chunk = True
        self.hwm = 0
        self.submit_step = -1
        self.first_sched_step = -1
        self.first_token_step = -1
        self.finish_step = -1
        self.recomputed_tokens = 0
        self.scheduled_tokens = 0
        self.prefix_hit_tokens_at_admission = 0
        self.submit_time_s = _NAN
        self.first_token_time_s = _NAN
        self.finish_time_s = _NAN
        self.last_token_time_s = _NAN
        self.itl_max_s = 0.0
        self.num_itl = 0
        # Clock of the last update while decode progress is kept lazily (lazy_decode.py);
        # -1 when the counters above are up to date by themselves.
        self.lz_d0 = -1
        self.lz_seq = 0
        # This request's grant in the ``schedule()`` call whose mark is ``grant_mark``
        # (scheduler.py ``SchedulerOutput``): a grant is kept on the request, not in a map.
        self.grant = 0
        self.grant_mark = 0

    def block_key(self, i: int) -> int:
        """Key of block ``i`` (tokens ``[i*B, (i+1)*B)``), equal across requests exactly when
        the chained token hashes would be."""
        if i < self.num_shared_blocks:
            return self.group_key_base - i - 1
        return self.key_base + i

    def is_finished(self) -> bool:
        return self.status > PREEMPTED

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={RequestStatus(self.status).name}, "
                f"L={self.num_tokens}, c={self.num_computed_tokens}, "
                f"out={self.num_output_tokens}/{self.max_tokens})")
