"""Per-agent defaults: what each kind of agent may hold and spawn."""

from __future__ import annotations

from dataclasses import dataclass

from governor.errors import ConfigError

__all__ = ["AgentSpec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSpec:
    """One kind of agent (a planner, a coder, a searcher), not one running instance.

    ``ceiling_tokens`` caps the context of each of its leases; ``max_fanout`` caps how
    many of its children run at once; ``prefix`` names a prefix registered with the
    governor (a shared system prompt or tool schema) that its context starts with, and
    ``system_prompt`` is its own system prompt when it has no registered prefix;
    ``tool_output_tokens`` is the budget a tool result is summarized to before it is
    appended (None: tool results are appended as they are).
    """

    name: str
    ceiling_tokens: int
    max_fanout: int = 4
    priority: int = 0
    system_prompt: str | None = None
    prefix: str | None = None
    tool_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"an agent needs a non-empty name, got {self.name!r}", setting="name")
        for setting, minimum in (("ceiling_tokens", 1), ("max_fanout", 1)):
            value = getattr(self, setting)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConfigError.below_minimum(setting, value, minimum)
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ConfigError(
                f"priority must be an int (larger runs first), got {self.priority!r}",
                setting="priority",
            )
        if self.system_prompt is not None and self.prefix is not None:
            raise ConfigError(
                f"agent {self.name!r} sets both system_prompt and prefix; a registered "
                "prefix already holds the system prompt, so set one of them",
                setting="prefix",
            )
        tool = self.tool_output_tokens
        if tool is not None:
            if not isinstance(tool, int) or isinstance(tool, bool) or tool < 1:
                raise ConfigError.below_minimum("tool_output_tokens", tool, 1)
            if tool >= self.ceiling_tokens:
                raise ConfigError(
                    f"agent {self.name!r}: tool_output_tokens ({tool:,}) must be below its "
                    f"ceiling ({self.ceiling_tokens:,}) or one tool result fills the context",
                    setting="tool_output_tokens",
                )
