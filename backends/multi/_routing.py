"""How ``MultiBackend`` picks a replica for a new budget (or a call without one).

``Routing`` is the rule's configuration; ``PrefixIndex`` is what the router believes each
replica has cached, kept on the client side from the requests it sent there.

The rule, after SGLang's router (``sgl-router``, ``policies/cache_aware.rs``: an
approximate radix tree per worker of the raw text routed to it; the load balance
thresholds ``balance_abs_threshold`` and ``balance_rel_threshold``; ``cache_threshold``):

1. Candidates: the replicas in rotation where the budget fits now (its reservation
   within the replica's limit, ``governor.placement``). A budget already running on a
   replica never gets here: it stays there (affinity) while that replica is in rotation
   and has room for it.
2. Imbalance, as SGLang: when ``max - min > balance_abs_threshold`` and ``max >
   balance_rel_threshold * min`` over the candidates' calls in flight, the least loaded
   candidate (shortest queue).
3. Else the candidate whose cached prefix of this request is longest (matched
   characters over the request's), when that rate is above ``cache_threshold``; ties go
   to the one with more free blocks.
4. Else the candidate with the most free blocks (SGLang: the smallest tree, i.e. the
   most cache room; kvgov knows the blocks each replica has left, so it uses those).

Where kvgov differs from SGLang's router: it routes budgets (an agent's lease), not
single requests, so an agent's calls stay where its own context is cached, which a
per-request router only finds again by prefix; it filters by the blocks the governor
reserved (a lease goes only where it fits); and its prefix record is hashed chunks of
``chunk_chars`` characters chained from the cache salt (tenants never match each
other's text, as the engines' salted hashes never hit), capped per replica at about what
its KV holds (``chars_per_token`` characters a token) and evicted least recently used,
where SGLang keeps a character tree with a size cap and a periodic eviction thread.
``round_robin`` is the baseline: new budgets in turn, affinity kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from governor import ConfigError, GenerationRequest

__all__ = ["PrefixIndex", "Routing", "request_text"]

_POLICIES = ("cache_aware", "round_robin")


@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    """``MultiBackend``'s routing rule (see this module's docstring)."""

    policy: str = "cache_aware"  # or "round_robin"
    cache_threshold: float = 0.5  # SGLang's router: 0.5 at first, 0.3 in current releases
    balance_abs_threshold: int = 8  # calls in flight; SGLang's 64 is for a cluster's traffic
    balance_rel_threshold: float = 1.5  # as SGLang's
    chunk_chars: int = 64
    chars_per_token: int = 4  # to size a replica's record from its KV tokens
    probe_interval_s: float = 1.0  # a replica out of rotation is asked /health this often
    failover_retries: int = 1  # a model call that found its replica down, sent elsewhere

    def __post_init__(self) -> None:
        if self.policy not in _POLICIES:
            raise ConfigError(
                f"routing policy must be one of {', '.join(_POLICIES)}, got {self.policy!r}",
                setting="policy",
            )
        if not 0 <= self.cache_threshold <= 1:
            raise ConfigError(
                f"cache_threshold is a match rate in [0, 1], got {self.cache_threshold!r}",
                setting="cache_threshold",
            )
        for setting in ("balance_abs_threshold", "chunk_chars", "chars_per_token"):
            value = getattr(self, setting)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError.below_minimum(setting, value, 1)
        if not isinstance(self.failover_retries, int) or self.failover_retries < 0:
            raise ConfigError.below_minimum("failover_retries", self.failover_retries, 0)
        if self.balance_rel_threshold < 1 or self.probe_interval_s <= 0:
            raise ConfigError(
                "balance_rel_threshold must be >= 1 and probe_interval_s > 0, got "
                f"{self.balance_rel_threshold!r} and {self.probe_interval_s!r}",
                setting="balance_rel_threshold",
            )


def request_text(request: GenerationRequest) -> str:
    """The text a request's prompt starts with, as the router matches it."""
    if request.messages is not None:
        return "".join(f"{m.get('role', '')}\x1f{_content(m)}\x1e" for m in request.messages)
    prompt = request.prompt
    if isinstance(prompt, str):
        return prompt
    return " ".join(map(str, prompt or ()))


def _content(message: Any) -> str:
    content = message.get("content", "")
    return content if isinstance(content, str) else repr(content)


class PrefixIndex:
    """Per replica, the chained hashes of the text chunks sent there, least recently
    used first. Not thread-safe: the ledger's lock guards it."""

    def __init__(self, num_replicas: int, *, chunk_chars: int) -> None:
        self._chunk = chunk_chars
        self._seen: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self._caps = [0] * num_replicas

    def set_cap(self, replica: int, num_chunks: int) -> None:
        self._caps[replica] = max(1, num_chunks)

    def chain(self, text: str, salt: str | None) -> list[int]:
        """The hash of each full chunk, each chained from the one before (and the salt)."""
        hashes, parent = [], hash(("kvgov-multi", salt))
        for start in range(0, len(text) - self._chunk + 1, self._chunk):
            parent = hash((parent, text[start : start + self._chunk]))
            hashes.append(parent)
        return hashes

    def matched(self, replica: int, chain: Sequence[int]) -> int:
        """Characters of the chain's text the replica is believed to hold, from the start."""
        seen = self._seen[replica]
        num = 0
        for key in chain:
            if key not in seen:
                break
            num += 1
        return num * self._chunk

    def insert(self, replica: int, chain: Sequence[int]) -> None:
        seen = self._seen[replica]
        for key in chain:
            seen[key] = None
            seen.move_to_end(key)
        while len(seen) > self._caps[replica]:
            seen.popitem(last=False)

    def drop(self, replica: int) -> None:
        """The replica lost its cache (down, or restarted)."""
        self._seen[replica].clear()

    def size(self, replica: int) -> int:
        return len(self._seen[replica])
