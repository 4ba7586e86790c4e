"""``LlamaCppProbe``: what llama.cpp's ``llama-server`` says about its KV.

Read from the routes of llama.cpp's ``tools/server`` (checked against commit 0c1e570,
2026-10):

- ``GET /props``: ``total_slots``, ``default_generation_settings.n_ctx`` (one slot's
  context), ``build_info``, ``model_path``.
- ``GET /slots`` (unless ``--no-slots``): per slot ``id``, ``n_ctx``, ``is_processing``,
  and for its last task ``n_prompt_tokens`` and ``next_token[0].n_decoded``.
- ``GET /metrics`` (only with ``--metrics``): the ``llamacpp:`` counters and gauges,
  ``requests_processing``, ``requests_deferred``, ``prompt_tokens_total`` (tokens
  evaluated), ``prompt_tokens_cached_total`` (tokens reused from a slot's cache),
  ``n_decode_total``. This version has no KV usage gauge (older ones had
  ``kv_cache_usage_ratio`` and ``kv_cache_tokens``: read when present).

llama.cpp's KV has no blocks: capacity is read in tokens (``block_size`` 1). With a KV
split per slot (the default with ``-np N``), each slot owns ``n_ctx`` tokens and the
total is their sum; with ``--kv-unified`` every slot may grow to ``n_ctx`` in one pool of
``n_ctx`` tokens. The server does not say which it runs, and both look the same on its
routes: the user says (``kv_unified``).

A NaN, infinite or negative figure reads as absent (``backends.http.probe_shape``); a
route whose body is not of llama-server's shape (``/props`` as a list) raises
``BackendError``, never a bare ``ValueError`` or ``AttributeError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from backends.http.probe import EngineReading, ProbeHTTP, SlotReading
from backends.http.probe_shape import count_or_none, read_checked
from backends.http.prometheus_text import parse_exposition

__all__ = ["LlamaCppProbe", "parse_llamacpp_metrics"]

_PREFIX = "llamacpp:"


class LlamaCppProbe:
    """Reads ``/props``, ``/slots`` and ``/metrics`` into one ``EngineReading``."""

    __slots__ = ("kv_unified",)

    def __init__(self, *, kv_unified: bool = False) -> None:
        self.kv_unified = kv_unified

    @property
    def engine(self) -> str:
        return "llama.cpp"

    def read(self, http: ProbeHTTP) -> EngineReading:
        return read_checked(self.engine, http, lambda: self._read(http))

    def _read(self, http: ProbeHTTP) -> EngineReading:
        props = _object(http.get_json("/props"), "/props")
        missing: list[str] = []
        settings = _object(
            props.get("default_generation_settings"), "/props default_generation_settings"
        )
        n_ctx = _int(settings.get("n_ctx"))
        total_slots = _int(props.get("total_slots"))
        slots = _slots(http.get_json("/slots"))
        if not slots:
            missing.append("/slots (the server runs with --no-slots)")
        if n_ctx is None and slots:
            n_ctx = slots[0].n_ctx
        if total_slots is None and slots:
            total_slots = len(slots)
        text = http.get_text("/metrics")
        metrics = parse_llamacpp_metrics(text) if text is not None else {}
        if text is None:
            missing.append("/metrics (start llama-server with --metrics)")
        usage = metrics.get("kv_cache_usage_ratio")
        if usage is None:
            missing.append("a KV usage gauge (this llama-server version exposes none)")
        prompt = metrics.get("prompt_tokens_total")
        cached = metrics.get("prompt_tokens_cached_total")
        return EngineReading(
            block_size=None if n_ctx is None else 1,
            num_blocks=_capacity(n_ctx, total_slots, self.kv_unified),
            max_model_len=n_ctx,
            kv_usage=usage,
            num_tokens_in_use=_int(metrics.get("kv_cache_tokens")),
            num_requests_running=_int(metrics.get("requests_processing")),
            num_requests_waiting=_int(metrics.get("requests_deferred")),
            prefix_cache_queries=None if prompt is None else int(prompt + (cached or 0)),
            prefix_cache_hits=_int(cached),
            instance=f"{props.get('build_info', '')} {props.get('model_path', '')}".strip() or None,
            slots=slots,
            missing=tuple(missing),
            raw={"props_total_slots": total_slots, "metrics": metrics},
        )


def parse_llamacpp_metrics(text: str) -> dict[str, float]:
    """``llamacpp:name value`` samples by name, without the prefix (llama-server labels
    none; the exposition parser the vLLM and SGLang probes use reads the text)."""
    return {
        sample.name.removeprefix(_PREFIX): sample.value
        for sample in parse_exposition(text).finite().samples
        if sample.name.startswith(_PREFIX)
    }


def _capacity(n_ctx: int | None, total_slots: int | None, kv_unified: bool) -> int | None:
    if n_ctx is None:
        return None
    return n_ctx if kv_unified or not total_slots else n_ctx * total_slots


def _slots(body: Any) -> tuple[SlotReading, ...]:
    if not isinstance(body, Sequence) or isinstance(body, (str, bytes)):
        return ()
    slots = []
    for entry in body:
        if not isinstance(entry, Mapping) or _int(entry.get("id")) is None:
            continue
        slots.append(
            SlotReading(
                id=int(entry["id"]),
                n_ctx=_int(entry.get("n_ctx")) or 0,
                num_tokens=_held(entry),
                is_processing=entry.get("is_processing"),
            )
        )
    return tuple(slots)


def _held(entry: Mapping[str, Any]) -> int | None:
    """Tokens of the slot's last task: its prompt and what it decoded."""
    prompt = _int(entry.get("n_prompt_tokens"))
    if prompt is None:
        return None
    decoded = 0
    tokens = entry.get("next_token")
    for token in tokens if isinstance(tokens, list) else ():
        if isinstance(token, Mapping):
            decoded += _int(token.get("n_decoded")) or 0
    return prompt + decoded


def _int(value: Any) -> int | None:
    return count_or_none(value)


def _object(body: Any, where: str) -> Mapping[str, Any]:
    """A JSON object, or ``{}`` for one not there; ``TypeError`` (a ``BackendError`` from
    ``read``) for a body of another shape: the server is not the llama-server read here."""
    if body is None:
        return {}
    if not isinstance(body, Mapping):
        raise TypeError(f"{where} is a JSON {type(body).__name__}, not an object")
    return body
