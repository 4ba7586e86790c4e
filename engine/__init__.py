"""kvgov's paged-KV inference engine.

Plain-Python block management (``BlockManager`` over a ``BlockPool``) decides where
every token's K/V lives; ``KVCache`` holds the tensors; ``Engine`` runs a model over
them with continuous batching, budgets, ceilings and preemption, and ``EngineLoop``
lets many threads and event loops share one engine. The engine never imports the
governor, policies or integrations: it works without them.
"""

from engine.attention import AttentionBackend, AttentionMetadata, ReferenceAttention
from engine.attention.select import get_attention_backend
from engine.block_manager import BlockManager
from engine.block_pool import BlockPool
from engine.block_results import (
    Allocation,
    AppendResult,
    BlockMove,
    BlockStats,
    Fit,
    PinnedPrefix,
    Shortfall,
)
from engine.block_table import SequenceState
from engine.budget import BudgetInfo
from engine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from engine.config import EngineConfig, PreemptionMode
from engine.device import default_dtype, resolve_device
from engine.engine import Engine
from engine.engine_loop import EngineInUseError, EngineLoop, EngineLoopClosedError, RequestStream
from engine.errors import (
    BudgetExceededError,
    BudgetInUseError,
    CapacityError,
    CeilingExceededError,
    ChatTemplateError,
    DoubleFreeError,
    DuplicateBudgetError,
    DuplicateSequenceError,
    EngineError,
    InvalidRequestError,
    ModelConfigError,
    ModelError,
    ModelLoadError,
    OutOfBlocksError,
    OutOfSwapSpaceError,
    PinnedBlockError,
    SamplingParamsError,
    SequenceStateError,
    TokenizerLoadError,
    UnknownBudgetError,
    UnknownPinError,
    UnknownPresetError,
    UnknownSequenceError,
    WeightsDoNotFitError,
)
from engine.hf_export import export_preset
from engine.host_swap import HostSwap, SwapSizing
from engine.kv_cache import BlockPairs, KVCache
from engine.model_config import ModelConfig, RopeScaling
from engine.models import LlamaForCausalLM
from engine.outputs import (
    BudgetBlocks,
    Capacity,
    Completion,
    EngineMetrics,
    KVSnapshot,
    RequestOutput,
)
from engine.presets import (
    PRESETS,
    Preset,
    build_preset_model,
    get_preset,
)
from engine.request import FinishReason, RequestStatus
from engine.sampling import Sampler, SamplingParams
from engine.stop import StopChecker, StopResult, TokenStopChecker
from engine.tokenizer import IncrementalDecoder, Tokenizer, load_tokenizer
from engine.weights import load_model

__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "PRESETS",
    "Allocation",
    "AppendResult",
    "AttentionBackend",
    "AttentionMetadata",
    "BlockManager",
    "BlockMove",
    "BlockPairs",
    "BlockPool",
    "BlockStats",
    "BudgetBlocks",
    "BudgetExceededError",
    "BudgetInUseError",
    "BudgetInfo",
    "Capacity",
    "CapacityError",
    "CeilingExceededError",
    "ChatTemplate",
    "ChatTemplateError",
    "Completion",
    "DoubleFreeError",
    "DuplicateBudgetError",
    "DuplicateSequenceError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineInUseError",
    "EngineLoop",
    "EngineLoopClosedError",
    "EngineMetrics",
    "FinishReason",
    "Fit",
    "HostSwap",
    "IncrementalDecoder",
    "InvalidRequestError",
    "KVCache",
    "KVSnapshot",
    "LlamaForCausalLM",
    "ModelConfig",
    "ModelConfigError",
    "ModelError",
    "ModelLoadError",
    "OutOfBlocksError",
    "OutOfSwapSpaceError",
    "PinnedBlockError",
    "PinnedPrefix",
    "PreemptionMode",
    "Preset",
    "ReferenceAttention",
    "RequestOutput",
    "RequestStatus",
    "RequestStream",
    "RopeScaling",
    "Sampler",
    "SamplingParams",
    "SamplingParamsError",
    "SequenceState",
    "SequenceStateError",
    "Shortfall",
    "StopChecker",
    "StopResult",
    "SwapSizing",
    "TokenStopChecker",
    "Tokenizer",
    "TokenizerLoadError",
    "UnknownBudgetError",
    "UnknownPinError",
    "UnknownPresetError",
    "UnknownSequenceError",
    "WeightsDoNotFitError",
    "build_preset_model",
    "default_dtype",
    "export_preset",
    "get_attention_backend",
    "get_preset",
    "load_model",
    "load_tokenizer",
    "resolve_device",
]
