"""governor.errors: the hierarchy, the fields each error carries, messages that say what
to do, and errors that survive pickling (worker pools send them across processes)."""

from __future__ import annotations

import copy
import pickle

import pytest

from governor import errors
from governor.errors import (
    AdmissionRejected,
    BackendError,
    CeilingExceeded,
    ConfigError,
    GovernorError,
    LeaseError,
    LeaseNotFound,
    LeaseReleased,
    TopologyError,
)

EXAMPLES: list[GovernorError] = [
    AdmissionRejected(32_000, 16_000, agent="planner"),
    AdmissionRejected(requested=4_096, possible=0),
    CeilingExceeded("worker-3", 17_250, 16_000),
    LeaseNotFound("lease-7"),
    LeaseReleased(7, agent="worker-1"),
    TopologyError(
        "a planner and 12 workers at 16,000 tokens need 208,000 tokens, the budget holds 71,424",
        "cap max_fanout at 3 or lower the workers' ceiling to 4,000 tokens",
    ),
    BackendError("the engine loop stopped", backend="local"),
    errors.BackendUnavailable("connection refused", backend="remote"),
    ConfigError.safety_factor_out_of_range(1.5),
    ConfigError.below_minimum("ceiling_tokens", -5, 1),
    ConfigError.unknown_agent("critic", ["planner", "worker"]),
]


def test_the_hierarchy_is_the_one_drawn_in_the_docstring() -> None:
    for cls in (AdmissionRejected, CeilingExceeded, LeaseError, TopologyError, BackendError):
        assert issubclass(cls, GovernorError)
    assert issubclass(LeaseNotFound, LeaseError) and issubclass(LeaseReleased, LeaseError)
    assert issubclass(ConfigError, GovernorError) and issubclass(ConfigError, ValueError)
    for cls in (AdmissionRejected, CeilingExceeded, LeaseError, TopologyError, BackendError):
        assert not issubclass(cls, ValueError)
    for name in errors.__all__:
        assert name in errors.__doc__


def test_all_is_sorted_and_complete() -> None:
    assert errors.__all__ == sorted(errors.__all__)
    public = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and not name.startswith("_")
    }
    assert set(errors.__all__) == public


def test_admission_rejected_says_the_largest_ceiling_possible_and_what_to_do() -> None:
    error = AdmissionRejected(32_000, 16_000, agent="planner")
    assert (error.requested, error.possible, error.agent) == (32_000, 16_000, "planner")
    message = str(error)
    assert "32,000" in message and "'planner'" in message
    assert "largest ceiling possible is 16,000 tokens" in message
    assert "ask for at most" in message and "free memory" in message


def test_admission_rejected_when_nothing_fits_says_so() -> None:
    error = AdmissionRejected(requested=4_096, possible=0)
    assert error.agent is None
    assert "no ceiling fits at all" in str(error) and "free memory" in str(error)


def test_ceiling_exceeded_carries_the_numbers_and_the_remedies() -> None:
    error = CeilingExceeded("worker-3", 17_250, 16_000)
    assert (error.agent, error.tokens, error.ceiling) == ("worker-3", 17_250, 16_000)
    assert "17,250" in str(error) and "16,000" in str(error)
    assert "compact or summarize" in str(error) and "lease.grow()" in str(error)


def test_lease_errors_name_the_lease() -> None:
    missing = LeaseNotFound("lease-7")
    assert missing.lease_id == "lease-7" and "'lease-7'" in str(missing)
    assert "governor.lease()" in str(missing)
    released = LeaseReleased(7, agent="worker-1")
    assert (released.lease_id, released.agent) == (7, "worker-1")
    assert "already released" in str(released) and "governor.lease()" in str(released)
    assert "agent" not in str(LeaseReleased(7))


def test_topology_error_gives_the_reason_and_what_would_fit() -> None:
    error = TopologyError("12 workers do not fit", "cap max_fanout at 3")
    assert (error.reason, error.suggestion) == ("12 workers do not fit", "cap max_fanout at 3")
    assert str(error) == "12 workers do not fit; cap max_fanout at 3"


def test_backend_error_names_the_backend_when_known() -> None:
    assert (
        str(BackendError("timed out", backend="http://gpu-1")) == "backend http://gpu-1: timed out"
    )
    error = BackendError("timed out")
    assert str(error) == "timed out" and error.backend is None and error.problem == "timed out"


def test_config_error_messages_say_what_to_do() -> None:
    safety = ConfigError.safety_factor_out_of_range(1.5)
    assert safety.setting == "safety_factor"
    assert "(0, 1]" in str(safety) and "1.5" in str(safety) and "0.9" in str(safety)
    negative = ConfigError.below_minimum("ceiling_tokens", -5, 1)
    assert negative.setting == "ceiling_tokens"
    assert "at least 1" in str(negative) and "-5" in str(negative)
    assert "ceiling_tokens=1 or more" in str(negative)
    unknown = ConfigError.unknown_agent("critic", ["worker", "planner"])
    assert unknown.setting == "agent"
    assert "'critic'" in str(unknown) and "'planner', 'worker'" in str(unknown)
    assert "AgentSpec(name='critic'" in str(unknown)
    assert "none yet" in str(ConfigError.unknown_agent("critic", []))
    plain = ConfigError("pass tokenizer= or encoding=, not both")
    assert plain.setting is None and plain.problem == str(plain)


def test_config_error_is_caught_as_a_value_error() -> None:
    with pytest.raises(ValueError, match="safety_factor"):
        raise ConfigError.safety_factor_out_of_range(0)


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_errors_survive_pickling_and_copying(error: GovernorError) -> None:
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(clone) is type(error)
        assert str(clone) == str(error) and clone.args == error.args
        assert vars(clone) == vars(error)
