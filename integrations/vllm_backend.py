"""``VLLMBackend``: a vLLM server (``vllm serve``) behind the governor.

Capacity and pressure from ``VLLMProbe`` (``vllm:cache_config_info``, ``/v1/models``,
``vllm:kv_cache_usage_perc``...), summed over data-parallel engines; ``cache_salt`` per
tenant; ``priority`` negated (vLLM runs lower values first) and sent only where the server
runs ``--scheduling-policy priority``: say so with ``priority_scheduling=True`` (vLLM
publishes its policy only in dev mode). The rest as ``OpenAICompatibleBackend``.
"""

from __future__ import annotations

from typing import Any

from integrations._engine_backend import EngineBackend
from integrations._vllm_probe import VLLMProbe

__all__ = ["VLLMBackend"]


class VLLMBackend(EngineBackend):
    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        priority_scheduling: bool | None = None,
        salt_key: bytes | None = None,
        **options: Any,
    ) -> None:
        probe = VLLMProbe(priority_scheduling=priority_scheduling)
        super().__init__(base_url, model=model, probe=probe, salt_key=salt_key, **options)
