"""What a request to vLLM or SGLang carries for the governor: a priority in the engine's own
polarity, sent only where the engine schedules by it, and a cache salt per tenant.

Priority. The governor runs larger priorities first (``AgentSpec.priority``).
- vLLM runs LOWER values first (``ChatCompletionRequest.priority``: "lower means earlier
  handling") and only under ``--scheduling-policy priority``. Nothing public says which
  policy runs: ``/server_info?config_format=json`` (``scheduler_config.policy``) exists
  only with ``VLLM_SERVER_DEV_MODE=1``. Versions up to 0.10 refuse a non-zero priority
  under FCFS with a 400 ("Got priority N but Priority scheduling is not enabled."); 0.33
  ignores it. So kvgov sends a priority to vLLM only when the user declared the policy or
  the dev route showed it, and stops sending after that 400 (``is_priority_rejection``).
- SGLang runs HIGHER values first by default (``--enable-priority-scheduling``:
  "Requests with higher priority integer values will be scheduled first by default"; its
  ``SchedulePolicy.priority_sign`` is -1 unless ``--schedule-low-priority-values-first``).
  ``/server_info`` says both flags; with ``--abort-on-priority-when-disabled`` a priority
  sent to a server without priority scheduling aborts the request, so none is sent then.

Cache salt. vLLM hashes ``cache_salt`` into the first block's hash, so requests with
different salts never share prefix-cache blocks; its validator
(``validate_cache_salt``) takes 1 to 128 characters without ``@``, ``/``, ``\\`` or NUL,
and its docs ask for an unguessable salt (43 characters of base64, 256 bits). SGLang 0.5.23
takes ``cache_salt`` on ``/v1/chat/completions`` too (any string) and keys its radix cache
with it. The governor's salt is the tenant's name: guessable, and a name with ``/`` or
``@`` would be refused, so ``engine_cache_salt`` sends an HMAC-SHA256 of it under a key the
backend holds, base64url (43 characters, none of the refused ones).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

__all__ = ["PriorityRule", "engine_cache_salt", "is_priority_rejection"]


@dataclass(frozen=True, slots=True)
class PriorityRule:
    """Whether and how an engine takes a priority; ``reason`` says how kvgov knows."""

    enabled: bool
    lower_first: bool
    reason: str

    def value(self, priority: int) -> int | None:
        """The value to send for the governor's ``priority`` (larger runs first);
        ``None``: send no priority at all."""
        if not self.enabled:
            return None
        return -priority if self.lower_first else priority


def engine_cache_salt(salt: str | None, *, key: bytes) -> str | None:
    """The ``cache_salt`` sent for the governor's salt (a tenant); ``None`` for none."""
    if salt is None:
        return None
    digest = hmac.new(key, salt.encode("utf-8"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def is_priority_rejection(status: int, message: str) -> bool:
    """A vLLM (up to 0.10) 400 that refuses a priority because the server runs FCFS."""
    return status == 400 and "priority scheduling is not enabled" in message.lower()
