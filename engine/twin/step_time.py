"""The step-time model: how long one engine step takes on a device, from its batch, and the
fit of the model's efficiency factors to a measured step-time grid.

A step is a roofline over its dense and attention work, plus fixed costs per step,
sequence and token and a prefill's re-reads of its cache that a CPU's kernel does not
hide; ``fit`` finds the non-negative coefficients that minimize the squared relative
error over the samples. The formula, each term and the fit: docs/design/twin.md.

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── FitError     samples that cannot be fitted or evaluated (too few, another device,
                     a non-positive time), or a held-back fraction outside (0, 1)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.errors import InvalidRequestError
from engine.twin.profiles import FACTOR_FIELDS, DeviceProfile, Source
from engine.twin.shapes import ModelShape, StepBatch, StepSample

__all__ = [
    "FitError",
    "FitReport",
    "StepTime",
    "StepTimeModel",
    "StepWork",
    "decode_work",
    "evaluate",
    "fit",
    "split_held_back",
    "step_work",
]

QUANTIZATION_GROUP_SIZE = 128  # engine.quantization.scheme.DEFAULT_GROUP_SIZE, torch-free here
MIN_SAMPLES = 8  # seven factors and one over them: fewer leave the fit undetermined
MAX_EFFICIENCY = 1e6  # a term the samples never exercise fits to ~0 cost: held finite for JSON


class FitError(InvalidRequestError):
    """Samples that cannot be fitted or evaluated."""


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step moves and computes: the roofline's inputs."""

    num_sequences: int
    num_tokens: int
    dense_flops: float
    weight_bytes: float
    attention_flops: float
    kv_bytes: float
    prefill_context_bytes: float


def step_work(model: ModelShape, batch: StepBatch) -> StepWork:
    attended = sum(
        s.num_new_tokens * s.num_context_tokens + s.num_new_tokens * (s.num_new_tokens + 1) / 2
        for s in batch.sequences
    )
    return _work(
        model,
        num_sequences=batch.num_sequences,
        num_tokens=batch.num_tokens,
        attended=attended,
        kv_tokens=sum(s.num_context_tokens + 2 * s.num_new_tokens for s in batch.sequences),
        cached=sum(s.num_context_tokens for s in batch.sequences if not s.is_decode),
    )


def decode_work(model: ModelShape, num_sequences: int, num_context_tokens: int) -> StepWork:
    """``step_work`` of a step in which each of ``num_sequences`` sequences decodes one
    token over ``num_context_tokens`` cached tokens in all (each at least one), to the
    bit: every sequence attends its context and its new token (``attended``, a float
    summing exact integers), reads its context and writes its token (``kv_tokens``), and
    no prefill chunk re-reads a cache (``cached``). A decode run times its steps by it
    without building their batches."""
    return _work(
        model,
        num_sequences=num_sequences,
        num_tokens=num_sequences,
        attended=float(num_context_tokens + num_sequences),
        kv_tokens=num_context_tokens + 2 * num_sequences,
        cached=0,
    )


def _work(
    model: ModelShape,
    *,
    num_sequences: int,
    num_tokens: int,
    attended: float,
    kv_tokens: int,
    cached: int,
) -> StepWork:
    act_bytes = model.activation_bits / 8
    projection_bits: float = model.weight_bits
    if model.weight_bits < model.activation_bits:
        projection_bits += model.activation_bits / QUANTIZATION_GROUP_SIZE
    other_weights = model.num_parameters - model.num_projection_weights
    weight_bytes = model.num_projection_weights * projection_bits / 8 + other_weights * act_bytes
    lm_head_flops = 2 * model.vocab_size * model.hidden_size
    dense_flops = 2 * model.num_projection_weights * num_tokens
    dense_flops += lm_head_flops * num_sequences
    attention_flops = 4 * model.num_layers * model.num_heads * model.head_dim * attended
    query_heads_per_kv_head = model.num_heads / model.num_kv_heads
    return StepWork(
        num_sequences=num_sequences,
        num_tokens=num_tokens,
        dense_flops=float(dense_flops),
        weight_bytes=float(weight_bytes),
        attention_flops=float(attention_flops),
        kv_bytes=float(kv_tokens * model.kv_bytes_per_token),
        prefill_context_bytes=float(cached * query_heads_per_kv_head * model.kv_bytes_per_token),
    )


@dataclass(frozen=True, slots=True)
class StepTime:
    """One predicted step, term by term (seconds)."""

    overhead_s: float
    dense_compute_s: float
    dense_memory_s: float
    attention_s: float
    prefill_context_s: float = 0.0  # the prefill chunks' reads of their cached K/V

    @property
    def dense_bound(self) -> str:
        """``"compute"`` or ``"memory"``: which side of the dense roofline sets its time."""
        return "compute" if self.dense_compute_s >= self.dense_memory_s else "memory"

    @property
    def seconds(self) -> float:
        dense = max(self.dense_compute_s, self.dense_memory_s)
        return self.overhead_s + dense + self.attention_s + self.prefill_context_s


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """The formula in this module's docstring, with one profile's figures and factors."""

    profile: DeviceProfile

    def explain(self, model: ModelShape, batch: StepBatch) -> StepTime:
        return self._explain(model, step_work(model, batch))

    def seconds(self, model: ModelShape, batch: StepBatch) -> float:
        return self.explain(model, batch).seconds

    def decode_seconds(
        self, model: ModelShape, num_sequences: int, num_context_tokens: int
    ) -> float:
        """``seconds`` of a decode-only step (``decode_work``), to the bit."""
        return self._explain(model, decode_work(model, num_sequences, num_context_tokens)).seconds

    def _explain(self, model: ModelShape, work: StepWork) -> StepTime:
        p = self.profile
        peak = p.flops_s(model.activation_bits)
        bandwidth = p.memory_bandwidth_bytes_s
        attention = max(work.attention_flops / peak, work.kv_bytes / bandwidth)
        return StepTime(
            overhead_s=p.step_overhead_s
            + p.sequence_overhead_s * work.num_sequences
            + p.token_overhead_s * work.num_tokens,
            dense_compute_s=work.dense_flops / (p.compute_efficiency * peak),
            dense_memory_s=work.weight_bytes / (p.memory_efficiency * bandwidth),
            attention_s=attention / p.attention_efficiency,
            prefill_context_s=p.prefill_context_passes * work.prefill_context_bytes / bandwidth,
        )


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well a profile predicts measured steps: ``|predicted - measured| / measured``
    per sample, in the samples' order."""

    relative_errors: tuple[float, ...]

    @property
    def num_samples(self) -> int:
        return len(self.relative_errors)

    @property
    def median_error(self) -> float:
        return _quantile(self.relative_errors, 0.5)

    @property
    def p90_error(self) -> float:
        return _quantile(self.relative_errors, 0.9)

    @property
    def max_error(self) -> float:
        return max(self.relative_errors)


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    return float(np.quantile(np.asarray(values, dtype=float), q))


def evaluate(samples: Sequence[StepSample], profile: DeviceProfile) -> FitReport:
    _check_samples(samples, profile, minimum=1)
    model = StepTimeModel(profile)
    return FitReport(
        tuple(abs(model.seconds(s.model, s.batch) - s.seconds) / s.seconds for s in samples)
    )


def split_held_back(
    samples: Sequence[StepSample], fraction: float, seed: int
) -> tuple[tuple[StepSample, ...], tuple[StepSample, ...]]:
    """``(fit_on, held_back)``: a seeded, deterministic choice of ``fraction`` of the samples
    (at least one, never all) held back from the fit; each part keeps the samples' order."""
    if not 0 < fraction < 1:
        raise FitError(f"a held-back fraction is between 0 and 1 (exclusive), got {fraction!r}")
    if len(samples) < 2:
        raise FitError(f"holding samples back needs at least 2 samples, got {len(samples)}")
    num_held = min(len(samples) - 1, max(1, round(fraction * len(samples))))
    held = set(random.Random(seed).sample(range(len(samples)), num_held))
    return (
        tuple(s for i, s in enumerate(samples) if i not in held),
        tuple(s for i, s in enumerate(samples) if i in held),
    )


def fit(samples: Sequence[StepSample], *, profile: DeviceProfile) -> DeviceProfile:
    """``profile`` with its seven factors fitted to ``samples`` (measured on that device) and
    named in ``fitted``; its published figures are kept as they are."""
    _check_samples(samples, profile, minimum=MIN_SAMPLES)
    columns = _columns(samples, profile)
    prior = math.log(profile.memory_efficiency / profile.compute_efficiency)

    def solve(log_ratio: float) -> tuple[float, np.ndarray]:
        return _nnls_relative(columns, math.exp(log_ratio))

    # The ratio e_m / e_c decides, per sample, which side of the dense roofline binds: a
    # coarse log grid finds the basin, a golden-section search refines it. Ties (samples
    # all on one side leave the ratio free) go to the prior's ratio.
    grid = sorted(
        [prior, *np.linspace(math.log(1e-3), math.log(1e3), 61)],
        key=lambda r: (round(solve(r)[0], 12), abs(r - prior)),
    )
    best = grid[0]
    step = math.log(1e3 / 1e-3) / 60
    best = _golden_min(lambda r: solve(r)[0], best - step, best + step, tie=best)
    _, (c0, c1, c2, k_m, k_a, n_p) = solve(best)
    k_c = k_m * math.exp(best)
    factors = {
        "step_overhead_s": c0,
        "sequence_overhead_s": c1,
        "token_overhead_s": c2,
        "memory_efficiency": _efficiency(k_m),
        "compute_efficiency": _efficiency(k_c),
        "attention_efficiency": _efficiency(k_a),
        "prefill_context_passes": n_p,
    }
    note = Source(
        field="",
        title="kvgov twin fit",
        url="",
        figure=f"fitted on {len(samples)} measured steps (relative least squares)",
    )
    sources = tuple(s for s in profile.sources if s.field not in FACTOR_FIELDS)
    sources += tuple(dataclasses.replace(note, field=f) for f in FACTOR_FIELDS)
    return dataclasses.replace(
        profile,
        **factors,
        sources=sources,
        fitted=tuple(sorted(set(profile.fitted) | set(FACTOR_FIELDS))),
    )


def _check_samples(samples: Sequence[StepSample], profile: DeviceProfile, *, minimum: int) -> None:
    if len(samples) < minimum:
        raise FitError(
            f"{len(samples)} step samples; at least {minimum} are needed: record a larger "
            "step-time grid"
        )
    for sample in samples:
        if sample.device != profile.name:
            raise FitError(
                f"a sample was measured on {sample.device!r}, not on {profile.name!r}: fit "
                "and evaluate each device's profile on its own grid"
            )
        if not (math.isfinite(sample.seconds) and sample.seconds > 0):
            raise FitError(
                f"a sample of {sample.batch.num_sequences} sequences took {sample.seconds!r} s; "
                "a measured step takes a finite positive time: drop it or measure it again"
            )
        if sample.batch.num_sequences == 0:
            raise FitError("a sample with an empty batch: an engine step computes something")


@dataclass(frozen=True, slots=True)
class _Columns:
    """The model's terms per sample, with the factors left out: seconds at efficiency 1."""

    seconds: np.ndarray
    num_sequences: np.ndarray
    num_tokens: np.ndarray
    dense_compute: np.ndarray
    dense_memory: np.ndarray
    attention: np.ndarray
    prefill_context: np.ndarray


def _columns(samples: Sequence[StepSample], profile: DeviceProfile) -> _Columns:
    rows = []
    for sample in samples:
        work = step_work(sample.model, sample.batch)
        peak = profile.flops_s(sample.model.activation_bits)
        bandwidth = profile.memory_bandwidth_bytes_s
        rows.append(
            (
                sample.seconds,
                work.num_sequences,
                work.num_tokens,
                work.dense_flops / peak,
                work.weight_bytes / bandwidth,
                max(work.attention_flops / peak, work.kv_bytes / bandwidth),
                work.prefill_context_bytes / bandwidth,
            )
        )
    table = np.asarray(rows, dtype=float)
    return _Columns(*(table[:, i] for i in range(7)))


def _nnls_relative(columns: _Columns, ratio: float) -> tuple[float, np.ndarray]:
    """Non-negative (c0, c1, c2, k_m, k_a, n_p) minimizing the summed squared relative
    error, with the dense term k_m * max(ratio * compute, memory); and that sum. Six
    unknowns: every subset of them held at zero is solved and the best feasible one kept,
    which is exact."""
    dense = np.maximum(ratio * columns.dense_compute, columns.dense_memory)
    design = np.stack(
        [
            np.ones_like(dense),
            columns.num_sequences,
            columns.num_tokens,
            dense,
            columns.attention,
            columns.prefill_context,
        ],
        1,
    )
    design = design / columns.seconds[:, None]
    target = np.ones_like(columns.seconds)
    num_unknowns = design.shape[1]
    best_loss, best = float(target @ target), np.zeros(num_unknowns)
    for size in range(1, num_unknowns + 1):
        for free in itertools.combinations(range(num_unknowns), size):
            solution, *_ = np.linalg.lstsq(design[:, free], target, rcond=None)
            if (solution < 0).any():
                continue
            theta = np.zeros(num_unknowns)
            theta[list(free)] = solution
            residual = design @ theta - target
            loss = float(residual @ residual)
            if loss < best_loss - 1e-15:
                best_loss, best = loss, theta
    return best_loss, best


def _golden_min(
    loss: Callable[[float], float], low: float, high: float, *, tie: float, num_steps: int = 40
) -> float:
    """The minimum of ``loss`` on [low, high] by golden-section search; ``tie`` where it is
    no worse (a flat loss leaves the coarse grid's choice in place)."""
    inverse_phi = (math.sqrt(5) - 1) / 2
    a, b = low, high
    for _ in range(num_steps):
        c, d = b - inverse_phi * (b - a), a + inverse_phi * (b - a)
        if loss(c) <= loss(d):
            b = d
        else:
            a = c
    found = (a + b) / 2
    return found if loss(found) < loss(tie) - 1e-12 else tie


def _efficiency(inverse: float) -> float:
    return MAX_EFFICIENCY if inverse <= 1 / MAX_EFFICIENCY else 1 / inverse
