"""Sampling: per-request ``SamplingParams`` and the batched ``Sampler``.

Each row of a logits batch is sampled with its own parameters, in vLLM v1's order:
temperature, then top-k, then top-p, then one draw. Greedy rows (temperature 0) take the
argmax, ties going to the lowest token id. A random draw is the Gumbel-max trick
(``argmax(logits + g)`` with Gumbel noise ``g``, the same distribution as sampling from
``softmax(logits)``): a seeded request draws its noise from its own ``torch.Generator``,
so the same seed gives the same tokens whatever else shares the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

import torch

from engine.errors import InvalidRequestError, SamplingParamsError
from engine.host_staging import stage_values

__all__ = ["Sampler", "SamplingParams", "request_generator"]

# Below this temperature a row is greedy: dividing logits by it would overflow float32.
_GREEDY_BELOW = 1e-5
# Top-p first looks for its set among this many most likely tokens; see _apply_top_p.
_TOP_P_CANDIDATES = 1024
_MAX_SEED = 2**64


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    ``top_k`` 0 and ``top_p`` 1.0 turn those filters off. ``top_k`` keeps the k most
    likely tokens; ``top_p`` keeps the smallest set of most likely tokens whose
    probability mass reaches p; both also keep any token tied with the least likely one
    they keep, so ties never depend on sort order. ``stop`` strings end the text
    (cut before the match unless ``include_stop_str_in_output``); ``stop_token_ids`` and,
    unless ``ignore_eos``, the tokenizer's EOS ids end generation.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, "an int >= 1", minimum=1)
        _check_float("temperature", self.temperature, "a finite float >= 0 (0 is greedy)")
        if self.temperature < 0:
            raise SamplingParamsError("temperature", self.temperature, "a finite float >= 0")
        _check_float("top_p", self.top_p, "a float in (0, 1] (1 turns top-p off)")
        if not 0 < self.top_p <= 1:
            raise SamplingParamsError("top_p", self.top_p, "a float in (0, 1] (1 turns it off)")
        _check_int("top_k", self.top_k, "an int >= 0 (0 turns top-k off, not -1)", minimum=0)
        if self.seed is not None:
            _check_int("seed", self.seed, f"None or an int in [0, {_MAX_SEED})", minimum=0)
            if self.seed >= _MAX_SEED:
                raise SamplingParamsError("seed", self.seed, f"None or an int in [0, {_MAX_SEED})")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(name, getattr(self, name), "a bool")
        # Lists are accepted for convenience and frozen into tuples; a lone string is one
        # stop string, not a tuple of its characters.
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (tuple, list)) or not all(isinstance(s, str) and s for s in stop):
            raise SamplingParamsError("stop", self.stop, "a tuple of non-empty strings")
        ids = self.stop_token_ids
        if not isinstance(ids, (tuple, list)) or not all(_is_int(i) and i >= 0 for i in ids):
            raise SamplingParamsError("stop_token_ids", ids, "a tuple of token ids (ints >= 0)")
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "stop", tuple(stop))
        object.__setattr__(self, "stop_token_ids", tuple(ids))

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_BELOW

    def stop_token_set(self, eos_token_ids: frozenset[int]) -> frozenset[int]:
        """The token ids that end this request, given the tokenizer's EOS ids."""
        ids = frozenset(self.stop_token_ids)
        return ids if self.ignore_eos else ids | eos_token_ids


def request_generator(
    params: SamplingParams, *, device: torch.device | str
) -> torch.Generator | None:
    """The generator a request keeps for its whole life, or None when it needs none."""
    if params.seed is None or params.is_greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed)
    return generator


class Sampler:
    """Picks one token per row of a ``[S, V]`` logits batch, each row with its own params.

    Unseeded random rows draw from the sampler's own generator (one per device), seeded
    with ``seed`` when given, so a whole run can be made reproducible.
    """

    __slots__ = ("_generators", "_seed")

    def __init__(self, *, seed: int | None = None) -> None:
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> torch.Tensor:
        """Token ids ``[S]`` (int64, on the logits' device) for logits ``[S, V]``."""
        if logits.dim() != 2 or logits.shape[0] != len(params):
            raise InvalidRequestError(
                f"logits must be [S, V] with one row per SamplingParams; got shape "
                f"{tuple(logits.shape)} for {len(params)} params"
            )
        if generators is None:
            generators = [None] * len(params)
        elif len(generators) != len(params):
            raise InvalidRequestError(
                f"got {len(generators)} generators for {len(params)} params; pass one per "
                "row (None for rows without a seed)"
            )
        logits = logits.float()
        greedy = [p.is_greedy for p in params]
        if all(greedy):
            return logits.argmax(dim=-1)
        device = logits.device
        tokens = torch.empty(len(params), dtype=torch.long, device=device)
        greedy_rows = [i for i, is_greedy in enumerate(greedy) if is_greedy]
        random_rows = [i for i, is_greedy in enumerate(greedy) if not is_greedy]
        if greedy_rows:
            index = _index(greedy_rows, device)
            tokens[index] = logits[index].argmax(dim=-1)
        index = _index(random_rows, device)
        tokens[index] = self._sample_random(
            logits[index], [params[i] for i in random_rows], [generators[i] for i in random_rows]
        )
        return tokens

    def _sample_random(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:
        device = logits.device
        temperature = _host_to([p.temperature for p in params], logits.dtype, device)
        logits = logits / temperature.unsqueeze(1)  # [R, V]
        # Rows without a filter are left untouched, so each row's values (and a seeded
        # row's draw) are bit for bit what they would be in any other batch.
        logits = _apply_top_k(logits, [p.top_k for p in params])
        logits = _apply_top_p(logits, [p.top_p for p in params])
        noise = torch.empty_like(logits)
        unseeded = [i for i, g in enumerate(generators) if g is None]
        if unseeded:
            shape = (len(unseeded), logits.shape[1])
            noise[_index(unseeded, device)] = _gumbel(shape, self._generator(device), logits)
        for row, generator in enumerate(generators):
            if generator is not None:
                noise[row] = _gumbel((logits.shape[1],), generator, logits)
        return (logits + noise).argmax(dim=-1)

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self._seed is None:
                generator.seed()
            else:
                generator.manual_seed(self._seed)
            self._generators[device] = generator
        return generator


def _apply_top_k(logits: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """``logits`` [R, V] with tokens below each row's k-th largest set to -inf (0: off)."""
    rows = [i for i, k in enumerate(top_k) if 0 < k < logits.shape[1]]
    if not rows:
        return logits
    index = _index(rows, logits.device)
    ks = _host_to([top_k[i] for i in rows], torch.int64, logits.device)
    chosen = logits[index]
    # The largest k from the Python list: ks.max() would sync with the GPU every step.
    largest = max(top_k[i] for i in rows)
    kth = chosen.topk(largest, dim=-1).values.gather(1, (ks - 1).unsqueeze(1))
    logits = logits.clone()
    logits[index] = chosen.masked_fill(chosen < kth, -math.inf)
    return logits


def _apply_top_p(logits: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """``logits`` [R, V] without the tokens outside each row's top-p set (1.0: off).

    The set is the smallest group of most likely tokens whose probability reaches p,
    plus any token tied with the least likely of them. It is usually found among the
    ``_TOP_P_CANDIDATES`` most likely tokens (a top-k, far cheaper than sorting the
    vocabulary); rows whose candidates hold less than p are sorted in full. Both give
    the same cut-off, bit for bit: the same values in the same order.
    """
    rows = [i for i, p in enumerate(top_p) if p < 1]
    if not rows:
        return logits
    device = logits.device
    index = _index(rows, device)
    chosen = logits[index]  # [n, V]
    p = _host_to([top_p[i] for i in rows], logits.dtype, device).unsqueeze(1)
    log_total = chosen.logsumexp(dim=-1, keepdim=True)  # [n, 1]
    candidates = chosen.topk(min(_TOP_P_CANDIDATES, chosen.shape[1]), dim=-1).values
    cutoff, covered = _top_p_cutoff(candidates, log_total, p)
    if device.type != "cpu":
        # Asking which rows fell short would read the device on the host mid-step; a GPU
        # sorts every top-p row instead and keeps the full cut-off where it is needed.
        ordered = chosen.sort(dim=-1, descending=True).values
        full, _ = _top_p_cutoff(ordered, log_total, p)
        cutoff = torch.where(covered.unsqueeze(1), cutoff, full)
    elif not bool(covered.all()):
        short = (~covered).nonzero().squeeze(1)
        ordered = chosen[short].sort(dim=-1, descending=True).values
        cutoff[short], _ = _top_p_cutoff(ordered, log_total[short], p[short])
    logits = logits.clone()
    logits[index] = chosen.masked_fill(chosen < cutoff, -math.inf)
    return logits


def _top_p_cutoff(
    descending: torch.Tensor, log_total: torch.Tensor, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest logit to keep ``[n, 1]``, and whether ``descending`` held mass p."""
    probs = (descending - log_total).exp()  # [n, K]
    mass = probs.cumsum(dim=-1)
    # A token is kept while the tokens above it hold less than p (the first always is).
    num_kept = ((mass - probs) < p).sum(dim=-1, keepdim=True)
    return descending.gather(1, num_kept - 1), mass[:, -1] >= p[:, 0]


def _gumbel(shape: tuple[int, ...], generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """Gumbel noise: argmax(logits + noise) samples softmax(logits).

    From uniform u as -log(-log(u)); u == 0 gives -inf, never NaN.
    """
    uniform = torch.rand(shape, generator=generator, dtype=like.dtype, device=like.device)
    return uniform.log_().neg_().log_().neg_()


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return _host_to(rows, torch.long, device)


def _host_to(
    values: list[float] | list[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``values`` on ``device`` without blocking the host (``engine.host_staging``)."""
    return stage_values(values, dtype=dtype, device=device)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(field: str, value: object, allowed: str, *, minimum: int) -> None:
    if not _is_int(value) or value < minimum:
        raise SamplingParamsError(field, value, allowed)


def _check_float(field: str, value: object, allowed: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise SamplingParamsError(field, value, allowed)
