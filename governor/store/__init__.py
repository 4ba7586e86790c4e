"""Where the governor keeps its state: in this process (``LocalStore``, the default), or
on Redis, shared by governors in many processes and machines (``RedisStore``).

A store builds the governor's admission ledger (``admission(...)``). Design:
docs/design/store.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from governor.store.local import LocalStore
from governor.store.redis_store import RedisStore
from governor.store.shared import lease_process

if TYPE_CHECKING:
    from governor.admission_base import AdmissionBase
    from governor.admission_policy import AdmissionPolicy
    from governor.clock import Clock
    from governor.config import GovernorConfig

__all__ = ["LocalStore", "RedisStore", "StateStore", "lease_process"]


@runtime_checkable
class StateStore(Protocol):
    def admission(
        self,
        *,
        config: GovernorConfig,
        available_blocks: int,
        block_size: int,
        policy: AdmissionPolicy | None,
        clock: Clock,
    ) -> AdmissionBase: ...
