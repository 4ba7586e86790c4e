"""GovernorConfig and AgentSpec refuse bad settings at construction, saying what to do."""

from __future__ import annotations

import pytest

from governor.agent import AgentSpec
from governor.config import AdmissionMode, GovernorConfig
from governor.errors import ConfigError


def test_defaults_are_valid() -> None:
    config = GovernorConfig()
    assert config.mode is AdmissionMode.GUARANTEED
    assert 0 < config.safety_factor <= 1
    assert AgentSpec(name="planner", ceiling_tokens=16_000).max_fanout == 4


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        (dict(safety_factor=0), "safety_factor"),
        (dict(safety_factor=1.5), "safety_factor"),
        (dict(safety_factor=float("nan")), "safety_factor"),
        (dict(headroom_ratio=-0.1), "headroom_ratio"),
        (dict(default_ceiling_tokens=-5), "default_ceiling_tokens"),
        (dict(max_concurrent=0), "max_concurrent"),
        (dict(max_per_agent=True), "max_per_agent"),
        (dict(aging_s=0), "aging_s"),
        (dict(admission_timeout_s=-1), "admission_timeout_s"),
        (dict(mode="guaranteed"), "mode"),
    ],
)
def test_bad_governor_settings(kwargs: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        GovernorConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.setting == setting
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "setting", "phrase"),
    [
        (dict(name="", ceiling_tokens=10), "name", "non-empty name"),
        (dict(name="a", ceiling_tokens=-1), "ceiling_tokens", "at least 1"),
        (dict(name="a", ceiling_tokens=10, max_fanout=0), "max_fanout", "at least 1"),
        (dict(name="a", ceiling_tokens=10, priority=1.5), "priority", "larger runs first"),
        (
            dict(name="a", ceiling_tokens=10, system_prompt="x", prefix="p"),
            "prefix",
            "set one of them",
        ),
        (dict(name="a", ceiling_tokens=10, tool_output_tokens=10), "tool_output_tokens", "fills"),
    ],
)
def test_bad_agent_specs(kwargs: dict[str, object], setting: str, phrase: str) -> None:
    with pytest.raises(ConfigError, match=phrase) as info:
        AgentSpec(**kwargs)  # type: ignore[arg-type]
    assert info.value.setting == setting
