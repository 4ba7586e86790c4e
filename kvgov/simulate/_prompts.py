"""Prompts of a recorded trace's sizes: chat messages that the twin's stand-in model
renders to exactly the token counts each call recorded, grown the way the context grew.

The content is filler (one token a word) behind a tag that is the agent's own, so no two
agents share a block the recording did not let them share; what the twin needs from a
prompt is its length and what it shares:

- a kind with a shared prefix (``TraceWorkload.prefix_tokens``) starts every agent's
  history with one system message of exactly that many tokens, the same for the kind;
  kvgov registers it as the kind's prefix, the other schemes meet it in the prefix cache;
- each later call extends the previous call's messages (a reply and a user turn, or more
  of the last turn where the context grew by less than those take), so its prompt starts
  with the previous prompt's tokens, as an agent's history does;
- a call whose context shrank (a compaction, a fresh conversation in the lease) starts
  again from the shared prefix, with a tag of its own after it.

The chat template is the stand-in's (``tiny-random``: ChatML on cl100k): each message
renders to its own tokens and the prompt is their concatenation, which is what lets
``_Book`` size a message without encoding the history again (the tests check the sum
against the whole). A prompt shorter than the template's least (a header and the tag) is
sent at that least and counted in ``num_rounded``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvgov.simulate.trace import TracedAgent, TraceWorkload

__all__ = ["PromptBook"]

Message = dict[str, Any]
_FILLER = " a"  # one cl100k token, however many follow one another


@dataclass(slots=True)
class PromptBook:
    """Every call's messages, by agent, and each kind's shared prefix message."""

    prefixes: dict[str, Message]
    messages: dict[str, list[list[Message]]] = field(default_factory=dict)
    sent_tokens: dict[str, list[int]] = field(default_factory=dict)  # each call's prompt
    num_rounded: int = 0  # calls sent longer than recorded: shorter than the template allows

    @classmethod
    def of(cls, workload: TraceWorkload, tokenizer: Any) -> PromptBook:
        sizer = _Sizer(tokenizer)
        prefixes = {
            kind: sizer.sized("system", f"[{kind}]", tokens, generation=False)[0]
            for kind, tokens in workload.prefix_tokens
        }
        book = cls(prefixes)
        for agent in workload.agents:
            book.messages[agent.name] = book._agent(agent, sizer)
        return book

    def _agent(self, agent: TracedAgent, sizer: _Sizer) -> list[list[Message]]:
        sent = self.sent_tokens.setdefault(agent.name, [])
        prefix = self.prefixes.get(agent.kind)
        history: list[Message] = []
        lengths: list[int] = []  # lengths[j]: the tokens of history[:j], no reply priming
        calls: list[list[Message]] = []
        previous = None
        for index, call in enumerate(agent.calls):
            target = call.prompt_tokens
            if previous is None or target < previous:
                history = [] if prefix is None else [prefix]
                lengths = [0] if prefix is None else [0, sizer.length(prefix)]
                head = f"[{agent.name} {index}]"
                message, got = sizer.sized("user", head, target, base=lengths[-1])
                history.append(message)
            else:
                reply: Message = {"role": "assistant", "content": f"[{index}]"}
                room = target - lengths[-1] - sizer.length(reply)
                if room >= sizer.least("user", ""):
                    history.append(reply)
                    lengths.append(lengths[-1] + sizer.length(reply))
                    message, got = sizer.sized("user", "", target, base=lengths[-1])
                    history.append(message)
                else:  # grew by less than a reply and a turn take: more of the last turn
                    last = history.pop()
                    lengths.pop()
                    role, content = last["role"], last["content"]
                    message, got = sizer.sized(role, content, target, base=lengths[-1])
                    history.append(message)
            lengths.append(got - sizer.priming)
            self.num_rounded += got != target
            sent.append(got)
            calls.append(list(history))
            previous = got
        return calls


class _Sizer:
    """Counts a message's tokens alone and sizes filler to a target."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        one: Message = {"role": "user", "content": "x"}
        self.priming = len(tokenizer.encode_chat([one])) - len(
            tokenizer.encode_chat([one], add_generation_prompt=False)
        )

    def length(self, message: Mapping[str, Any]) -> int:
        """Its tokens in a prompt, reply priming left out."""
        return len(self._tokenizer.encode_chat([dict(message)], add_generation_prompt=False))

    def least(self, role: str, head: str) -> int:
        return self.length({"role": role, "content": head})

    def sized(
        self,
        role: str,
        head: str,
        target: int,
        *,
        base: int = 0,
        generation: bool = True,
    ) -> tuple[Message, int]:
        """A message of ``role`` whose content is ``head`` and filler, after a history of
        ``base`` tokens, making the prompt ``target`` tokens where the template
        allows, else the fewest above; and the prompt's tokens."""
        priming = self.priming if generation else 0

        def total(k: int) -> int:
            return base + self.length({"role": role, "content": head + _FILLER * k}) + priming

        k = max(0, target - total(0))
        for _ in range(4):  # the filler's first word may merge with what is before it
            got = total(k)
            if got == target or (got > target and k == 0):
                break
            k = max(0, k + target - got)
        while total(k) < target:
            k += 1
        return {"role": role, "content": head + _FILLER * k}, total(k)
