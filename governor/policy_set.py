"""``Policies``: the four decisions a governor delegates, one object each.

- ``tool_output`` (``ToolOutputPolicy``): reduce a tool result over the agent's
  ``tool_output_tokens``; default ``HeadTailTruncation``.
- ``ceiling`` (``CeilingPolicy``): compact a conversation whose next call would exceed
  the ceiling; default ``RaiseAtCeiling``.
- ``admission`` (``AdmissionPolicy``): the order waiting leases are admitted in; default
  ``PriorityWithAging`` at ``GovernorConfig.aging_s``.
- ``pressure`` (``PressurePolicy``): whose idle KV to move when blocks run short;
  default ``PressureOrder``.

Any object with the protocol's method will do; policies/ has the others
(``ExtractiveSummarizer``, ``LLMSummarizer``, ``DropOldest``, ``SummarizeOldest``,
``Fifo``, ``FairShare``). A default that counts tokens counts them with the backend's
own tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from governor.admission_policy import AdmissionPolicy
from governor.ceiling import CeilingPolicy
from governor.errors import ConfigError
from governor.pressure import PressurePolicy
from governor.tool_output import ToolOutputPolicy

__all__ = ["Policies"]

_PROTOCOLS = {
    "tool_output": (ToolOutputPolicy, "reduce(text, *, budget_tokens, tool_name, arguments)"),
    "ceiling": (CeilingPolicy, "compact(messages, *, ceiling_tokens, reserve_tokens, counter)"),
    "admission": (AdmissionPolicy, "order(waiting, *, active, now)"),
    "pressure": (PressurePolicy, "choose(candidates, *, num_blocks_needed)"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Policies:
    """None keeps the governor's default for that decision."""

    tool_output: ToolOutputPolicy | None = None
    ceiling: CeilingPolicy | None = None
    admission: AdmissionPolicy | None = None
    pressure: PressurePolicy | None = None

    def __post_init__(self) -> None:
        for name, (protocol, method) in _PROTOCOLS.items():
            value = getattr(self, name)
            if value is not None and not isinstance(value, protocol):
                raise ConfigError(
                    f"policies.{name} must be a {protocol.__name__} (an object with "
                    f"{method}), got {type(value).__name__}",
                    setting=name,
                )
