"""``LocalStore``: the governor's state in this process, the default. It costs nothing:
the admission controller's ledger in memory, under one lock."""

from __future__ import annotations

from typing import TYPE_CHECKING

from governor.admission import AdmissionController

if TYPE_CHECKING:
    from governor.admission_policy import AdmissionPolicy
    from governor.clock import Clock
    from governor.config import GovernorConfig

__all__ = ["LocalStore"]


class LocalStore:
    def __repr__(self) -> str:
        return "LocalStore()"

    def admission(
        self,
        *,
        config: GovernorConfig,
        available_blocks: int,
        block_size: int,
        policy: AdmissionPolicy | None,
        clock: Clock,
    ) -> AdmissionController:
        return AdmissionController(
            config=config,
            available_blocks=available_blocks,
            block_size=block_size,
            policy=policy,
            clock=clock,
        )
