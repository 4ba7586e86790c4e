"""``VLLMBackend``: a vLLM server (``vllm serve``) behind the governor.

Capacity and pressure from ``VLLMProbe`` (``vllm:cache_config_info``, ``/v1/models``,
``vllm:kv_cache_usage_perc``...), summed over data-parallel engines; ``cache_salt`` per
tenant; ``priority`` negated (vLLM runs lower values first) and sent only where the server
runs ``--scheduling-policy priority``: say so with ``priority_scheduling=True`` (vLLM
publishes its policy only in dev mode). ``sent_cache_salt`` is the salt its calls carry
for a tenant's, the one vLLM's KV events report (``backends.multi.kv_events``). The rest as
``OpenAICompatibleBackend``.
"""

from __future__ import annotations

from typing import Any

from backends.openai._engine_backend import EngineBackend
from backends.openai._engine_requests import engine_cache_salt
from backends.openai._vllm_probe import VLLMProbe

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

    def sent_cache_salt(self, cache_salt: str | None) -> str | None:
        """The ``cache_salt`` this backend sends vLLM for the governor's (a tenant's); vLLM
        hashes it into the first block and reports it in that block's ``extra_keys``."""
        return engine_cache_salt(cache_salt, key=self._salt_key)
