"""``Plan``: what a fake call will produce, worked out before it starts.

The fake's output is scripted, so ``plan_output`` can run the whole script through the
engine's finish rules when a call is admitted: it decodes the tokens one at a time
(a character split across tokens is released with the token that completes it), cuts the
text at the first stop string, and records the finish reason and the most blocks the
call's block table will reach. The backend then releases the planned pieces one token
at a time and ``Plan.result`` gives the result of a call stopped at any point.
"""

from __future__ import annotations

import codecs
import math
from dataclasses import dataclass

import tiktoken

from governor.backend import GenerationResult

__all__ = ["Plan", "plan_output"]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a call will produce, decided at admission from its script and its limits."""

    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]  # text released by each token; they join to the result text
    finish_reason: str
    num_table_blocks: int  # blocks of its block table at its peak (charged to its budget)
    cached_tokens: int  # served by the pinned blocks it shares rather than allocates

    def result(self, num_prompt: int, produced: int, *, aborted: bool = False) -> GenerationResult:
        """The result of a call that stopped after ``produced`` of the planned tokens."""
        return GenerationResult(
            text="".join(self.pieces[:produced]),
            token_ids=self.token_ids[:produced],
            finish_reason="abort" if aborted else self.finish_reason,
            prompt_tokens=num_prompt,
            completion_tokens=produced,
            cached_tokens=self.cached_tokens,
        )


def plan_output(
    script: list[int],
    encoding: tiktoken.Encoding,
    *,
    num_prompt: int,
    block_size: int,
    max_tokens: int,
    ceiling: int,
    max_table_blocks: int,
    stop: tuple[str, ...],
    cached_tokens: int,
) -> Plan:
    """Run the script through the engine's finish rules, in the engine's order: a stop
    string, then max_tokens, then the ceiling, then (for the next step) the block limit."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = ""
    ends: list[int] = []  # text length after each token
    reason = "stop"  # the script ran out, as if the model sent end-of-sequence
    cut: int | None = None
    longest = max((len(s) for s in stop), default=0)
    for produced, token_id in enumerate(script, start=1):
        start = max(0, len(text) - longest + 1)
        text += decoder.decode(encoding.decode_single_token_bytes(token_id))
        ends.append(len(text))
        matches = [(i + len(s), i) for s in stop if (i := text.find(s, start)) >= 0]
        if matches:
            cut = min(matches)[1]
            break
        if produced >= max_tokens:
            reason = "length"
            break
        if num_prompt + produced >= ceiling:
            reason = "ceiling"
            break
        if produced < len(script) and math.ceil((num_prompt + produced) / block_size) > (
            max_table_blocks
        ):
            reason = "budget"
            break
    if cut is None:
        text += decoder.decode(b"", final=True)  # a character split across the last tokens
        ends[-1:] = [len(text)] * len(ends[-1:])
    else:
        text = text[:cut]
        ends = [min(end, cut) for end in ends]
    starts = [0, *ends[:-1]] if ends else []  # an empty script: no token at all
    pieces = tuple(text[a:b] for a, b in zip(starts, ends, strict=True))
    num_tokens = num_prompt + max(len(ends) - 1, 0)
    return Plan(
        token_ids=tuple(script[: len(ends)]),
        pieces=pieces,
        finish_reason=reason,
        num_table_blocks=math.ceil(num_tokens / block_size),
        cached_tokens=cached_tokens,
    )
