"""``VLLMProbe``: a vLLM server's KV capacity and pressure, from what its source defines
(vLLM 0.33.0, ``vllm/v1/metrics/loggers.py`` ``PrometheusStatLogger``; older names too).

- ``GET /metrics``: every engine-core family is labelled ``model_name`` and ``engine``
  (the data-parallel rank, ``"0"`` without DP; v0.8 and earlier had no ``engine``):
  ``vllm:cache_config_info`` (a gauge set to 1 whose labels are every ``CacheConfig``
  field as a string, among them ``num_gpu_blocks``, ``block_size`` and, since the hybrid
  KV work, ``kv_cache_size_tokens``, the capacity per rank in tokens that a hybrid model's
  blocks x block size gets wrong); ``vllm:kv_cache_usage_perc`` (0 to 1; v0.10 and
  earlier ``vllm:gpu_cache_usage_perc``); ``vllm:num_requests_running`` and
  ``_waiting``; the counters ``vllm:num_preemptions_total``,
  ``vllm:prefix_cache_queries_total`` and ``_hits_total`` in tokens (v0.9 to v0.10 also
  ``vllm:gpu_prefix_cache_queries_total`` and ``_hits_total``, read when the new ones are
  absent). With one API server the registry is prometheus_client's default, so
  ``process_start_time_seconds`` and each counter's ``_created`` are there; with
  ``--api-server-count`` > 1 it runs in multiprocess mode and neither is.
- ``GET /v1/models``: the served model's card carries ``max_model_len``.
- ``GET /version``: ``{"version": "0.33.0"}``.

``instance`` is the version and the process start time (else the earliest ``_created``),
so a restart shows even before a counter goes down. Every field the server does not
expose is ``None`` and named in ``missing``, once per field, with what to do about it; a
NaN or infinite sample is read as not exposed, and an answer of a shape the probe cannot
read raises ``BackendError`` (``backends.http.probe_shape``).
"""

from __future__ import annotations

from typing import Any, TypedDict

from backends.http.probe import EngineReading, ProbeHTTP
from backends.http.probe_shape import read_checked
from backends.http.prometheus_text import Exposition, parse_exposition
from backends.openai._engine_ranks import by_rank, int_or_none, sum_or_none, weighted_usage
from backends.openai._engine_requests import PriorityRule

__all__ = ["VLLMProbe"]

_RANK = "engine"
_CAPACITY_HINT = "declare the backend's capacity, else admission has no KV capacity to use"


class VLLMProbe:
    """Reads ``/metrics``, ``/v1/models`` and ``/version`` of a vLLM server.

    ``priority_scheduling``: whether the server runs ``--scheduling-policy priority``;
    ``None`` asks the dev-mode ``/server_info`` and, where that is off, sends no priority.
    """

    __slots__ = ("priority_scheduling",)

    def __init__(self, *, priority_scheduling: bool | None = None) -> None:
        self.priority_scheduling = priority_scheduling

    @property
    def engine(self) -> str:
        return "vllm"

    def read(self, http: ProbeHTTP) -> EngineReading:
        return read_checked(self.engine, http, lambda: self._read(http))

    def _read(self, http: ProbeHTTP) -> EngineReading:
        missing: list[str] = []
        text = http.get_text("/metrics")
        if text is None:
            missing.append("/metrics (404): no KV capacity or pressure; " + _CAPACITY_HINT)
        metrics = parse_exposition(text).finite() if text is not None else Exposition()
        ranks = _capacity_by_rank(metrics)
        if text is not None and not ranks:
            missing.append("vllm:cache_config_info: " + _CAPACITY_HINT)
        block_sizes = {rank["block_size"] for rank in ranks.values()}
        if len(block_sizes) > 1:
            missing.append(f"one block_size (the ranks differ: {sorted(block_sizes)})")
        tokens = {name: _rank_tokens(rank) for name, rank in ranks.items()}

        usage = by_rank(metrics, "vllm:kv_cache_usage_perc", rank_label=_RANK)
        if not usage:
            usage = by_rank(metrics, "vllm:gpu_cache_usage_perc", rank_label=_RANK)
        queries = by_rank(metrics, "vllm:prefix_cache_queries_total", rank_label=_RANK) or by_rank(
            metrics, "vllm:gpu_prefix_cache_queries_total", rank_label=_RANK
        )
        hits = by_rank(metrics, "vllm:prefix_cache_hits_total", rank_label=_RANK) or by_rank(
            metrics, "vllm:gpu_prefix_cache_hits_total", rank_label=_RANK
        )
        running = by_rank(metrics, "vllm:num_requests_running", rank_label=_RANK)
        waiting = by_rank(metrics, "vllm:num_requests_waiting", rank_label=_RANK)
        preemptions = by_rank(metrics, "vllm:num_preemptions_total", rank_label=_RANK)
        if text is not None:
            for name, values in (
                ("vllm:kv_cache_usage_perc", usage),
                ("vllm:num_requests_running", running),
                ("vllm:num_requests_waiting", waiting),
                ("vllm:num_preemptions_total", preemptions),
                ("vllm:prefix_cache_queries_total", queries),
                ("vllm:prefix_cache_hits_total", hits),
            ):
                if not values:
                    missing.append(name)

        max_model_len = _max_model_len(http.get_json("/v1/models"))
        if max_model_len is None:
            missing.append("max_model_len in /v1/models (the longest context one request may have)")
        version = _version(http.get_json("/version"))
        started = _start_time(metrics)
        if version is None and started is None:
            missing.append(
                "/version and a start time (a restart shows only as counters going down)"
            )
        elif started is None:
            missing.append(
                "process_start_time_seconds (multiprocess /metrics): a restart on the same "
                "version shows only as counters going down"
            )
        instance = (
            None if version is None and started is None else f"vllm {version} started {started}"
        )

        all_known = bool(ranks) and len(block_sizes) == 1
        return EngineReading(
            block_size=next(iter(block_sizes)) if len(block_sizes) == 1 else None,
            num_blocks=sum_or_none(rank["num_gpu_blocks"] for rank in ranks.values())
            if all_known
            else None,
            kv_tokens=sum_or_none(rank["kv_cache_size_tokens"] for rank in ranks.values())
            if ranks
            else None,
            max_model_len=max_model_len,
            kv_usage=weighted_usage(usage, tokens),
            num_requests_running=sum_or_none(running.values()),
            num_requests_waiting=sum_or_none(waiting.values()),
            num_preemptions=sum_or_none(preemptions.values()),
            prefix_cache_queries=sum_or_none(queries.values()),
            prefix_cache_hits=sum_or_none(hits.values()),
            instance=instance,
            missing=tuple(missing),
            raw={
                "version": version,
                "ranks": {
                    name: {
                        **rank,
                        "kv_usage": usage.get(name),
                        "running": running.get(name),
                        "waiting": waiting.get(name),
                        "preemptions": preemptions.get(name),
                        "prefix_cache_queries": queries.get(name),
                        "prefix_cache_hits": hits.get(name),
                    }
                    for name, rank in ranks.items()
                },
                "model_names": sorted(
                    {s.labels["model_name"] for s in metrics.samples if "model_name" in s.labels}
                ),
            },
        )

    def priority_rule(self, http: ProbeHTTP) -> PriorityRule:
        """Whether to send a priority (negated: vLLM runs lower values first)."""
        if self.priority_scheduling is not None:
            return PriorityRule(
                enabled=self.priority_scheduling, lower_first=True, reason="declared"
            )
        info = http.get_json("/server_info?config_format=json")
        policy = _dig(info, "vllm_config", "scheduler_config", "policy")
        if policy is None:
            return PriorityRule(
                enabled=False,
                lower_first=True,
                reason="vLLM does not say its scheduling policy outside dev mode: pass "
                "priority_scheduling=True if it runs --scheduling-policy priority",
            )
        return PriorityRule(
            enabled=policy == "priority", lower_first=True, reason=f"/server_info: {policy}"
        )


class _RankCapacity(TypedDict):
    block_size: int
    num_gpu_blocks: int
    kv_cache_size_tokens: int | None


def _capacity_by_rank(metrics: Exposition) -> dict[str, _RankCapacity]:
    ranks: dict[str, _RankCapacity] = {}
    for sample in metrics.named("vllm:cache_config_info"):
        block_size = int_or_none(sample.labels.get("block_size"))
        num_gpu_blocks = int_or_none(sample.labels.get("num_gpu_blocks"))
        if block_size is None or num_gpu_blocks is None:
            continue  # "None" before profiling: no capacity, never a guessed one
        ranks[sample.labels.get(_RANK, "0")] = {
            "block_size": block_size,
            "num_gpu_blocks": num_gpu_blocks,
            "kv_cache_size_tokens": int_or_none(sample.labels.get("kv_cache_size_tokens")),
        }
    return ranks


def _rank_tokens(rank: _RankCapacity) -> int:
    if rank["kv_cache_size_tokens"] is not None:
        return rank["kv_cache_size_tokens"]
    return rank["num_gpu_blocks"] * rank["block_size"]


def _max_model_len(body: Any) -> int | None:
    cards = body.get("data") if isinstance(body, dict) else None
    if not isinstance(cards, list):
        return None
    lengths = [
        int_or_none(card.get("max_model_len"))
        for card in cards
        if isinstance(card, dict) and card.get("parent") is None  # LoRA cards have a parent
    ]
    known = [length for length in lengths if length is not None]
    return known[0] if known else None


def _version(body: Any) -> str | None:
    version = body.get("version") if isinstance(body, dict) else None
    return str(version) if version is not None else None


def _start_time(metrics: Exposition) -> float | None:
    started = metrics.named("process_start_time_seconds")
    if started:
        return started[0].value
    created = [
        s.value
        for s in metrics.samples
        if s.name.startswith("vllm:") and s.name.endswith("_created")
    ]
    return min(created) if created else None


def _dig(body: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(body, dict):
            return None
        body = body.get(key)
    return body
