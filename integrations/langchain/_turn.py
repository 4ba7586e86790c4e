"""One model call of a governed ``create_agent`` run: its count, its ceiling, its usage.

Private to integrations/; ``GovernorMiddleware.wrap_model_call`` (sync and async) runs
``Turns.plan`` before the handler and ``Turns.answered`` (or ``Turns.ended``) after it:

- ``plan`` counts the request's system message and messages exactly with
  ``governor.counter``, as the governor sends them (``Governor.with_prefix``: the
  agent's registered prefix in front), and keeps the reply's reserve
  (``Governor.reply_reserve``: ``max_tokens``, else ``reply_reserve_tokens`` up to a
  quarter of the ceiling). ``on_ceiling="compact"`` runs ``Governor.compact`` and maps
  the dicts it returns back onto the request's message objects (the prefix left out: it
  is not the state's; ``integrations._messages.compact``); ``"raise"`` and ``"end"``
  compare the count with the lease's ceiling and raise ``CeilingExceeded`` or end the
  run.
- ``answered`` reads usage from the reply's ``usage_metadata`` (counts of its own when
  there is none), records it with ``Governor.record_call`` unless the model called
  through the lease itself (``lease.num_calls`` moved during the call), and builds the
  state update: counters, and after a compaction the compacted messages plus the reply
  behind ``RemoveMessage(REMOVE_ALL_MESSAGES)``, as LangChain's
  ``SummarizationMiddleware`` writes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain.agents.middleware.types import ExtendedModelResponse, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.types import Command

from governor import CeilingExceeded, Governor, Lease
from integrations._messages import compact, reported_usage, text_of, to_chats

__all__ = ["OnCeiling", "Turn", "Turns"]

OnCeiling = Literal["compact", "end", "raise"]


@dataclass(slots=True)
class Turn:
    """One model call: what is sent, what it counted, and the state update it makes."""

    request: ModelRequest[Any]
    lease: Lease
    tokens: int = 0  # the prompt, counted exactly
    calls_before: int = 0  # lease.num_calls before the call
    started: float = 0.0  # time.perf_counter() when the model was called
    update: dict[str, Any] = field(default_factory=dict)
    compacted: list[BaseMessage] | None = None  # the state's new messages, when compacted
    ending: AIMessage | None = None  # on_ceiling="end" at the ceiling: the run's last word


class Turns:
    """Plans and settles the model calls of one middleware's runs."""

    __slots__ = ("governor", "max_tokens", "on_ceiling")

    def __init__(self, governor: Governor, on_ceiling: OnCeiling, max_tokens: int | None) -> None:
        self.governor = governor
        self.on_ceiling = on_ceiling
        self.max_tokens = max_tokens

    def plan(self, lease: Lease, request: ModelRequest[Any], update: dict[str, Any]) -> Turn:
        """Count the request and apply the ceiling (see the module docstring)."""
        system = request.system_message
        originals: list[BaseMessage] = [system] if system is not None else []
        originals.extend(request.messages)
        turn = Turn(request, lease, calls_before=lease.num_calls, update=dict(update))
        governor = self.governor
        if self.on_ceiling == "compact":
            compacted, event = compact(governor, lease, originals, max_tokens=self.max_tokens)
            turn.tokens = event.tokens_after
            if compacted is not None:
                kept = [m for m in compacted if m is not system]
                # The request's own messages or from_chat's: each one of AnyMessage's types.
                turn.request = request.override(messages=kept)  # type: ignore[arg-type]  # see above
                turn.compacted = kept
                turn.update["kvgov_compactions"] = 1
                turn.update["kvgov_tokens_compacted"] = event.tokens_saved
        else:
            sent, _ = governor.with_prefix(lease, to_chats(originals))
            turn.tokens = governor.counter.count_messages(sent)
            needed = turn.tokens + governor.reply_reserve(lease, self.max_tokens)
            if needed > lease.ceiling_tokens:
                if self.on_ceiling == "raise":
                    raise CeilingExceeded(lease.agent.name, needed, lease.ceiling_tokens)
                turn.ending = AIMessage(
                    content=(
                        f"Stopped: agent {lease.agent.name!r} would hold {needed:,} tokens "
                        f"({turn.tokens:,} of context and {needed - turn.tokens:,} kept for "
                        f"the reply), over its ceiling of {lease.ceiling_tokens:,}."
                    )
                )
        turn.update["kvgov_peak_tokens"] = turn.tokens
        turn.started = time.perf_counter()
        return turn

    def ended(self, turn: Turn) -> ExtendedModelResponse[Any]:
        """The run's last word, in place of a model call."""
        assert turn.ending is not None
        update = {**turn.update, "jump_to": "end"}
        return ExtendedModelResponse(
            model_response=ModelResponse(result=[turn.ending]), command=Command(update=update)
        )

    def answered(self, turn: Turn, response: ModelResponse[Any]) -> ExtendedModelResponse[Any]:
        """The model's response, with the usage recorded and the state update attached."""
        replies = [m for m in response.result if isinstance(m, AIMessage)]
        reply = replies[-1] if replies else None
        usage = None if reply is None else reported_usage(reply)
        if usage is None:
            usage = {"prompt_tokens": turn.tokens, "completion_tokens": self._count_reply(reply)}
        lease = turn.lease
        if lease.num_calls == turn.calls_before:  # the model did not call through the lease
            elapsed_s = time.perf_counter() - turn.started
            self.governor.record_call(lease, **usage, elapsed_s=elapsed_s)
        prompt, output = usage["prompt_tokens"], usage["completion_tokens"]
        update = {
            **turn.update,
            "kvgov_model_calls": 1,
            "kvgov_input_tokens": prompt,
            "kvgov_output_tokens": output,
        }
        if turn.compacted is not None:
            update["messages"] = [
                RemoveMessage(id=REMOVE_ALL_MESSAGES),
                *turn.compacted,
                *response.result,
            ]
        return ExtendedModelResponse(model_response=response, command=Command(update=update))

    def _count_reply(self, reply: AIMessage | None) -> int:
        text = "" if reply is None else text_of(reply.content) or ""
        return self.governor.counter.count(text) if text else 0
