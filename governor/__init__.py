"""The runtime layer of kvgov: leases, admission, fan-out, ceilings and shared prefixes.

governor/ drives any inference engine through its own small ``Backend`` protocol and
never imports engine/: the backends that reach an engine live in backends/ (see
CONTRIBUTING.md for the import rules), so ``import governor`` does not import torch.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from governor.admission_policy import AdmissionPolicy, PriorityWithAging
from governor.agent import AgentSpec
from governor.backend import (
    Backend,
    BackendCapacity,
    BackendHealth,
    BackendMetrics,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    Message,
    PrefixHandle,
)
from governor.backend_async import ThreadedAsyncBookkeeping
from governor.ceiling import CeilingPolicy, CompactionEvent, RaiseAtCeiling
from governor.children import ChildContext
from governor.clock import SYSTEM_CLOCK, Clock, SystemClock, Timer
from governor.config import AdmissionMode, GovernorConfig
from governor.errors import (
    AdmissionRejected,
    AdmissionTimeout,
    BackendError,
    BackendUnavailable,
    CeilingExceeded,
    ConfigError,
    GovernorError,
    LeaseError,
    LeaseExpired,
    LeaseNotFound,
    LeaseReleased,
    StoreUnavailable,
    TopologyError,
)
from governor.events import GovernorEvent
from governor.fanout import FanoutLimiter, FanoutSlot, FanoutTimeout
from governor.governor import Governor, LeaseContext
from governor.lease import Lease, LeaseState
from governor.placement import Placement
from governor.policy_set import Policies
from governor.pressure import PressureChoice, PressureOrder, PressurePolicy
from governor.runs import Run, current_run_id
from governor.sizing import (
    DEFAULT_SAFETY_FACTOR,
    QWEN3_5_9B,
    KVShape,
    Scheme,
    SchemeComparison,
    SchemeSizing,
    blocks_per_seq,
    compare_schemes,
    kv_shape_from_hf_config,
    max_ceiling_tokens,
    max_concurrent,
)
from governor.store import LocalStore, RedisStore, StateStore
from governor.testing import FakeBackend
from governor.tokens import DEFAULT_ENCODING, TokenCounter, Tokenizes
from governor.tool_calls import ToolCall
from governor.tool_output import ToolOutputPolicy, ToolOutputReduction, reduce_output
from governor.topology import (
    DEFAULT_EXPECTED_USE,
    TopologyFit,
    TopologyReport,
    check_topology,
)
from governor.truncate import HeadTailTruncation

__all__ = [
    "DEFAULT_ENCODING",
    "DEFAULT_EXPECTED_USE",
    "DEFAULT_SAFETY_FACTOR",
    "QWEN3_5_9B",
    "SYSTEM_CLOCK",
    "AdmissionMode",
    "AdmissionPolicy",
    "AdmissionRejected",
    "AdmissionTimeout",
    "AgentSpec",
    "Backend",
    "BackendCapacity",
    "BackendError",
    "BackendHealth",
    "BackendMetrics",
    "BackendUnavailable",
    "CeilingExceeded",
    "CeilingPolicy",
    "ChildContext",
    "Clock",
    "CompactionEvent",
    "ConfigError",
    "FakeBackend",
    "FanoutLimiter",
    "FanoutSlot",
    "FanoutTimeout",
    "GenerationChunk",
    "GenerationRequest",
    "GenerationResult",
    "Governor",
    "GovernorConfig",
    "GovernorError",
    "GovernorEvent",
    "HeadTailTruncation",
    "KVShape",
    "Lease",
    "LeaseContext",
    "LeaseError",
    "LeaseExpired",
    "LeaseNotFound",
    "LeaseReleased",
    "LeaseState",
    "LocalStore",
    "Message",
    "Placement",
    "Policies",
    "PrefixHandle",
    "PressureChoice",
    "PressureOrder",
    "PressurePolicy",
    "PriorityWithAging",
    "RaiseAtCeiling",
    "RedisStore",
    "Run",
    "Scheme",
    "SchemeComparison",
    "SchemeSizing",
    "StateStore",
    "StoreUnavailable",
    "SystemClock",
    "ThreadedAsyncBookkeeping",
    "Timer",
    "TokenCounter",
    "Tokenizes",
    "ToolCall",
    "ToolOutputPolicy",
    "ToolOutputReduction",
    "TopologyError",
    "TopologyFit",
    "TopologyReport",
    "__version__",
    "blocks_per_seq",
    "check_topology",
    "compare_schemes",
    "current_run_id",
    "kv_shape_from_hf_config",
    "max_ceiling_tokens",
    "max_concurrent",
    "reduce_output",
]

try:
    __version__ = version("kvgov")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"
