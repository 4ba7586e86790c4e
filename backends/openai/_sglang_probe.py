"""``SGLangProbe``: an SGLang server's KV capacity and pressure, from what its source defines
(SGLang 0.5.23: ``srt/entrypoints/http_server.py``, ``srt/entrypoints/v1_loads.py``,
``srt/managers/load_snapshot.py``, ``srt/observability/metrics_collector.py``).

- ``GET /server_info`` (``/get_server_info`` on older versions, deprecated since): the
  server arguments flat (``page_size``, ``dp_size``, ``enable_priority_scheduling``,
  ``schedule_low_priority_values_first``...), the scheduler's ``max_total_num_tokens``
  (the KV pool of ONE data-parallel rank: the DP controller reports rank 0's),
  ``internal_states`` (one per rank), ``version``, and ``startup_time`` (durations of the
  start's phases, not a clock time).
- ``GET /v1/loads`` (``/get_load`` before, a list of ``dp_rank``, ``num_reqs``,
  ``num_waiting_reqs``, ``num_tokens``): per rank ``num_running_reqs``,
  ``num_waiting_reqs``, ``num_used_tokens``, ``max_total_num_tokens``, ``token_usage``,
  ``cache_hit_rate``.
- ``GET /metrics`` (with ``--enable-metrics``; multiprocess mode, so no ``_created`` and no
  process start): gauges ``sglang:token_usage``, ``sglang:num_used_tokens``,
  ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:cache_hit_rate``,
  ``sglang:max_total_num_tokens``, labelled ``model_name``, ``engine_type``, ``tp_rank``,
  ``pp_rank``, ``moe_ep_rank`` and, with DP, ``dp_rank`` (and an empty ``priority`` under
  priority scheduling); counters ``sglang:num_retracted_requests_total`` (SGLang's
  preemption), ``sglang:prompt_tokens_total`` and ``sglang:cached_tokens_total`` (by
  ``cache_source``), the prefix cache's queries and hits in tokens.

``/v1/loads`` is read first (it is SGLang's load API, one JSON body per rank), ``/metrics``
fills what it lacks. Capacity is ``max_total_num_tokens`` summed over ranks, blocks are
pages of ``page_size`` tokens. ``instance`` is the version and the start's phase
durations: two starts do not measure the same to the microsecond, and a restart also
shows as counters going down. A NaN or infinite figure (a sample or a load field) is read
as not exposed, and an answer of a shape the probe cannot read raises ``BackendError``
(``backends.http.probe_shape``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from backends.http.probe import EngineReading, ProbeHTTP
from backends.http.probe_shape import finite_or_none, read_checked
from backends.http.prometheus_text import Exposition, parse_exposition
from backends.openai._engine_ranks import by_rank, int_or_none, sum_or_none, weighted_usage
from backends.openai._engine_requests import PriorityRule

__all__ = ["SGLangProbe"]

_RANK = "dp_rank"
_CAPACITY_HINT = "declare the backend's capacity, else admission has no KV capacity to use"


class SGLangProbe:
    """Reads ``/server_info``, ``/v1/loads``, ``/v1/models`` and ``/metrics`` of SGLang."""

    __slots__ = ()

    @property
    def engine(self) -> str:
        return "sglang"

    def read(self, http: ProbeHTTP) -> EngineReading:
        return read_checked(self.engine, http, lambda: self._read(http))

    def _read(self, http: ProbeHTTP) -> EngineReading:
        missing: list[str] = []
        info = http.get_json("/server_info")
        if info is None:
            info = http.get_json("/get_server_info")
        if not isinstance(info, dict):
            missing.append("/server_info: no KV capacity or page size; " + _CAPACITY_HINT)
            info = {}
        loads = _loads(http)
        text = http.get_text("/metrics")
        if text is None:
            missing.append("/metrics (start SGLang with --enable-metrics)")
        metrics = parse_exposition(text).finite() if text is not None else Exposition()

        page_size = int_or_none(info.get("page_size"))
        dp_size = int_or_none(info.get("dp_size")) or 1
        # 0 is a snapshot not published yet, never a capacity
        capacity = {
            rank: int_or_none(load.get("max_total_num_tokens")) or None
            for rank, load in loads.items()
        }
        if not capacity or None in capacity.values():
            per_rank = by_rank(metrics, "sglang:max_total_num_tokens", rank_label=_RANK)
            capacity = {rank: int_or_none(value) or None for rank, value in per_rank.items()}
        pool = int_or_none(info.get("max_total_num_tokens")) or None
        if (not capacity or None in capacity.values()) and pool is not None:
            capacity = {str(rank): pool for rank in range(dp_size)}
        kv_tokens = sum_or_none(capacity.values())
        if kv_tokens is None:
            missing.append("max_total_num_tokens: " + _CAPACITY_HINT)
        if page_size is None:
            missing.append("page_size in /server_info")

        usage = _prefer(
            _field(loads, "token_usage"), by_rank(metrics, "sglang:token_usage", rank_label=_RANK)
        )
        used = _prefer(
            _field(loads, "num_used_tokens"),
            by_rank(metrics, "sglang:num_used_tokens", rank_label=_RANK),
        )
        running = _prefer(
            _field(loads, "num_running_reqs"),
            by_rank(metrics, "sglang:num_running_reqs", rank_label=_RANK),
        )
        waiting = _prefer(
            _field(loads, "num_waiting_reqs"),
            by_rank(metrics, "sglang:num_queue_reqs", rank_label=_RANK),
        )
        retracted = by_rank(metrics, "sglang:num_retracted_requests_total", rank_label=_RANK)
        queries = sum(s.value for s in metrics.named("sglang:prompt_tokens_total"))
        hits = sum(s.value for s in metrics.named("sglang:cached_tokens_total"))
        has_counters = metrics.has("sglang:prompt_tokens_total")
        for name, values in (
            ("sglang:token_usage", usage),
            ("sglang:num_used_tokens", used),
            ("sglang:num_running_reqs", running),
            ("sglang:num_queue_reqs", waiting),
        ):
            if not values:
                missing.append(f"{name} (nor its /v1/loads field)")
        if text is not None and not retracted:
            missing.append("sglang:num_retracted_requests_total")
        if text is not None and not has_counters:
            missing.append("sglang:prompt_tokens_total and sglang:cached_tokens_total")

        max_model_len = _max_model_len(http.get_json("/v1/models"), info)
        if max_model_len is None:
            missing.append("max_model_len in /v1/models (the longest context one request may have)")
        version = info.get("version")
        startup = info.get("startup_time")
        if version is None and startup is None:
            missing.append("version and startup_time in /server_info")
        instance = (
            None
            if version is None and startup is None
            else f"sglang {version} startup {json.dumps(startup, sort_keys=True)}"
        )
        num_blocks = kv_tokens // page_size if kv_tokens is not None and page_size else None
        return EngineReading(
            block_size=page_size,
            num_blocks=num_blocks,
            kv_tokens=kv_tokens,
            max_model_len=max_model_len,
            kv_usage=weighted_usage(usage, capacity),
            num_tokens_in_use=sum_or_none(used.values()) if used else None,
            num_requests_running=sum_or_none(running.values()) if running else None,
            num_requests_waiting=sum_or_none(waiting.values()) if waiting else None,
            num_preemptions=sum_or_none(retracted.values()) if retracted else None,
            prefix_cache_queries=int(queries) if has_counters else None,
            prefix_cache_hits=int(hits) if has_counters else None,
            instance=instance,
            missing=tuple(missing),
            raw={
                "version": version,
                "dp_size": dp_size,
                "ranks": {
                    rank: {
                        "max_total_num_tokens": capacity.get(rank),
                        "token_usage": usage.get(rank),
                        "num_used_tokens": used.get(rank),
                        "running": running.get(rank),
                        "waiting": waiting.get(rank),
                        "retracted": retracted.get(rank),
                    }
                    for rank in sorted(set(capacity) | set(usage) | set(running))
                },
                "enable_priority_scheduling": info.get("enable_priority_scheduling"),
                "schedule_low_priority_values_first": info.get(
                    "schedule_low_priority_values_first"
                ),
            },
        )

    def priority_rule(self, http: ProbeHTTP) -> PriorityRule:
        """Whether to send a priority, and in which polarity, as ``/server_info`` says."""
        info = http.get_json("/server_info")
        if info is None:
            info = http.get_json("/get_server_info")
        if not isinstance(info, dict):
            info = {}
        enabled = info.get("enable_priority_scheduling")
        if enabled is None:
            return PriorityRule(
                enabled=False,
                lower_first=False,
                reason="SGLang's /server_info does not say whether it schedules by priority",
            )
        lower_first = bool(info.get("schedule_low_priority_values_first"))
        return PriorityRule(
            enabled=bool(enabled),
            lower_first=lower_first,
            reason="/server_info: enable_priority_scheduling="
            f"{bool(enabled)}, schedule_low_priority_values_first={lower_first}",
        )


def _loads(http: ProbeHTTP) -> dict[str, Mapping[str, Any]]:
    """Per rank, ``/v1/loads``' fields, or ``/get_load``'s mapped to their new names."""
    body = http.get_json("/v1/loads")
    if isinstance(body, dict) and isinstance(body.get("loads"), list):
        return {
            str(load.get("dp_rank", 0)): load for load in body["loads"] if isinstance(load, dict)
        }
    legacy = http.get_json("/get_load")
    if not isinstance(legacy, list):
        return {}
    loads: dict[str, Mapping[str, Any]] = {}
    for load in legacy:
        if not isinstance(load, dict):
            continue
        waiting = int_or_none(load.get("num_waiting_reqs"))
        total = int_or_none(load.get("num_reqs"))  # running plus waiting
        loads[str(load.get("dp_rank", 0))] = {
            "num_waiting_reqs": waiting,
            "num_running_reqs": None if total is None or waiting is None else total - waiting,
        }  # its num_tokens counted differently across versions: not read
    return loads


def _field(loads: Mapping[str, Mapping[str, Any]], name: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for rank, load in loads.items():
        value = finite_or_none(load.get(name))
        if value is None:
            return {}
        values[rank] = value
    return values


def _prefer(loads: dict[str, float], metrics: dict[str, float]) -> dict[str, float]:
    """The load API's figures where they cover every rank ``/metrics`` shows, else
    ``/metrics``': one source per figure, never ranks of two moments added up."""
    if loads and set(loads) >= set(metrics):
        return loads
    return metrics or loads


def _max_model_len(body: Any, info: Mapping[str, Any]) -> int | None:
    cards = body.get("data") if isinstance(body, dict) else None
    if isinstance(cards, list):
        for card in cards:
            if isinstance(card, dict) and card.get("parent") is None:
                length = int_or_none(card.get("max_model_len"))
                if length is not None:
                    return length
    return int_or_none(info.get("context_length"))  # set only when the user passed it
