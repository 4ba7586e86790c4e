"""kvgov's paged-KV inference engine.

Plain-Python block management (``BlockManager`` over a ``BlockPool``) decides where
every token's K/V lives; ``KVCache`` holds the tensors. The engine never imports the
governor, policies or integrations: it works without them.
"""

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
from engine.device import default_dtype, resolve_device
from engine.errors import (
    BudgetExceededError,
    BudgetInUseError,
    CapacityError,
    CeilingExceededError,
    DoubleFreeError,
    DuplicateBudgetError,
    DuplicateSequenceError,
    EngineError,
    InvalidRequestError,
    OutOfBlocksError,
    OutOfSwapSpaceError,
    PinnedBlockError,
    SequenceStateError,
    UnknownBudgetError,
    UnknownPinError,
    UnknownSequenceError,
)
from engine.kv_cache import BlockPairs, KVCache

__all__ = [
    "Allocation",
    "AppendResult",
    "BlockManager",
    "BlockMove",
    "BlockPairs",
    "BlockPool",
    "BlockStats",
    "BudgetExceededError",
    "BudgetInUseError",
    "BudgetInfo",
    "CapacityError",
    "CeilingExceededError",
    "DoubleFreeError",
    "DuplicateBudgetError",
    "DuplicateSequenceError",
    "EngineError",
    "Fit",
    "InvalidRequestError",
    "KVCache",
    "OutOfBlocksError",
    "OutOfSwapSpaceError",
    "PinnedBlockError",
    "PinnedPrefix",
    "SequenceState",
    "SequenceStateError",
    "Shortfall",
    "UnknownBudgetError",
    "UnknownPinError",
    "UnknownSequenceError",
    "default_dtype",
    "resolve_device",
]
