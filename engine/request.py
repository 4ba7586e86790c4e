"""One generation request as the scheduler sees it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from engine.sampling import SamplingParams

__all__ = ["FinishReason", "Request", "RequestStatus"]


class RequestStatus(Enum):
    WAITING = "waiting"  # no blocks: not admitted yet, or preempted by recompute
    RUNNING = "running"  # blocks on the device
    SWAPPED = "swapped"  # blocks in host swap space
    FINISHED = "finished"


class FinishReason(Enum):
    STOP = "stop"  # an end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens generated
    CEILING = "ceiling"  # the context reached the request's token ceiling
    BUDGET = "budget"  # the request's named budget has no block left for it
    ABORT = "abort"


@dataclass(slots=True, eq=False)
class Request:
    """``token_ids`` is prompt plus output; the block table holds ``token_ids[:n]`` where
    ``n`` is what has been scheduled, and ``num_computed_tokens`` of those have K/V."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    arrival: int  # engine-wide counter: newer requests have larger values
    priority: int = 0  # larger runs first and is preempted last
    # What first come, first served orders it by within a priority (time.monotonic()):
    # its arrival, or its program's start (``Engine.add_request``'s ``order_time``).
    order_time: float = 0.0
    ceiling_tokens: int | None = None
    budget: str | None = None
    cache_salt: str | None = None
    num_shared_blocks: int = 0  # leading blocks hashed unsalted: a shared pin's (prefix_hash)
    generator: torch.Generator | None = None
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    num_preemptions: int = 0
    held: bool = False  # offloaded on request: not swapped back in until restored
    retain: bool = False  # its context is held once it finishes (``Engine.add_request``)
    stop_text: str | None = None  # the stop string that ended it, if any
    output_text: str = ""
    first_token_time: float | None = None
    arrival_time: float = 0.0
    finish_time: float | None = None
    # Its prompt's prefix-cache hashes while it waits (``Scheduler``), by the number of
    # tokens they were computed for: a request waiting many steps is asked each step.
    prompt_hashes: tuple[int, list[bytes]] | None = None
    # The hashes of its computed full blocks when it finished (``Scheduler.finish``):
    # what a hold of its context, and its budget's next prompt, start with.
    context_hashes: tuple[bytes, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def sort_key(self) -> tuple[int, float, int]:
        """Scheduling order: highest priority first, then earliest ``order_time`` (oldest
        program first, where one is given), then oldest first."""
        return (-self.priority, self.order_time, self.arrival)
