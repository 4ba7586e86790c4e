"""Errors raised by the engine.

Every error a caller can provoke is typed, carries the numbers that explain it as
fields, and says in its message what to do about it. ``assert`` is kept for the
engine's own invariants.

    EngineError
    ├── InvalidRequestError          bad argument: fix the call
    │   ├── UnknownSequenceError     no sequence with that id
    │   ├── DuplicateSequenceError   a sequence with that id already exists
    │   ├── UnknownBudgetError       no budget with that name
    │   ├── DuplicateBudgetError     a budget with that name is already open
    │   ├── BudgetInUseError         closing a budget that sequences still use
    │   ├── DoubleFreeError          freeing a block nobody holds
    │   ├── PinnedBlockError         freeing a reference that belongs to a pin
    │   ├── UnknownPinError          unpinning a prefix that is not pinned
    │   ├── SequenceStateError       wrong state for the call, e.g. append while swapped
    │   ├── SamplingParamsError      a sampling parameter outside its allowed range
    │   └── ChatTemplateError        a template that does not compile or rejects the messages
    ├── CapacityError                the request is valid but does not fit
    │   ├── OutOfBlocksError         the device pool has too few free blocks
    │   ├── OutOfSwapSpaceError      the host pool has too few free blocks
    │   ├── BudgetExceededError      a named budget would be exceeded
    │   └── CeilingExceededError     a sequence's token ceiling would be exceeded
    └── ModelError                   the model cannot be built from what was given
        ├── ModelConfigError         config missing, malformed or unsupported
        ├── ModelLoadError           weights missing, unexpected or mis-shaped
        ├── TokenizerLoadError       tokenizer files or tiktoken encoding unusable
        └── UnknownPresetError       no built-in preset with that name
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "BudgetInUseError",
    "CapacityError",
    "CeilingExceededError",
    "ChatTemplateError",
    "DoubleFreeError",
    "DuplicateBudgetError",
    "DuplicateSequenceError",
    "EngineError",
    "InvalidRequestError",
    "ModelConfigError",
    "ModelError",
    "ModelLoadError",
    "OutOfBlocksError",
    "OutOfSwapSpaceError",
    "PinnedBlockError",
    "SamplingParamsError",
    "SequenceStateError",
    "TokenizerLoadError",
    "UnknownBudgetError",
    "UnknownPinError",
    "UnknownPresetError",
    "UnknownSequenceError",
    "WeightsDoNotFitError",
]


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """The call itself is wrong (bad size, unknown id, wrong state)."""


class UnknownSequenceError(InvalidRequestError, KeyError):
    def __init__(self, seq_id: object) -> None:
        self.seq_id = seq_id
        super().__init__(
            f"no sequence {seq_id!r}: it was never allocated or was already freed; "
            "allocate it first or check the id"
        )

    def __str__(self) -> str:  # KeyError would otherwise print the repr of the message
        return str(self.args[0])


class DuplicateSequenceError(InvalidRequestError):
    def __init__(self, seq_id: object) -> None:
        self.seq_id = seq_id
        super().__init__(f"sequence {seq_id!r} already exists; free it first or use a new id")


class UnknownBudgetError(InvalidRequestError, KeyError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no budget named {name!r}; open it with open_budget() first")

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateBudgetError(InvalidRequestError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"budget {name!r} is already open; close it first or pick another name")


class BudgetInUseError(InvalidRequestError):
    def __init__(self, name: str, num_sequences: int) -> None:
        self.name = name
        self.num_sequences = num_sequences
        super().__init__(
            f"budget {name!r} still has {num_sequences} sequence(s); free them before closing it"
        )


class DoubleFreeError(InvalidRequestError):
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        super().__init__(
            f"block {block_id} is already free; each allocation must be freed exactly once"
        )


class PinnedBlockError(InvalidRequestError):
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        super().__init__(
            f"block {block_id} is held only by pins; release it with unpin(), not free()"
        )


class UnknownPinError(InvalidRequestError):
    def __init__(self, pin_id: int) -> None:
        self.pin_id = pin_id
        super().__init__(
            f"prefix pin {pin_id} is not held: it was never pinned here or was already unpinned"
        )


class SequenceStateError(InvalidRequestError):
    def __init__(self, seq_id: object, state: str, action: str, hint: str) -> None:
        self.seq_id = seq_id
        self.state = state
        self.action = action
        super().__init__(f"cannot {action} sequence {seq_id!r} while it is {state}; {hint}")


class SamplingParamsError(InvalidRequestError):
    """``field`` of a ``SamplingParams`` is ``value``, outside ``allowed``."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"SamplingParams.{field} must be {allowed}, got {value!r}")


class ChatTemplateError(InvalidRequestError):
    """A chat template does not compile, or it rejected the messages given to it."""


class CapacityError(EngineError):
    """A valid request that does not fit; ``needed`` and ``available`` say by how much."""

    def __init__(self, message: str, *, needed: int, available: int) -> None:
        self.needed = needed
        self.available = available
        super().__init__(message)


class OutOfBlocksError(CapacityError):
    def __init__(self, needed: int, available: int) -> None:
        super().__init__(
            f"need {needed} free KV block(s) but only {available} are free; free or swap out "
            "sequences, or give the engine more KV blocks",
            needed=needed,
            available=available,
        )


class OutOfSwapSpaceError(CapacityError):
    def __init__(self, needed: int, available: int) -> None:
        super().__init__(
            f"need {needed} free host block(s) to swap out but only {available} are free; "
            "raise the swap space or recompute instead of swapping",
            needed=needed,
            available=available,
        )


class BudgetExceededError(CapacityError):
    def __init__(self, name: str, needed: int, available: int, max_blocks: int) -> None:
        self.name = name
        self.max_blocks = max_blocks
        super().__init__(
            f"budget {name!r} caps its sequences at {max_blocks} block(s); this needs {needed} "
            f"more with {available} left; free sequences in it or open a larger budget",
            needed=needed,
            available=available,
        )


class CeilingExceededError(CapacityError):
    def __init__(self, seq_id: object, needed: int, ceiling_tokens: int) -> None:
        self.seq_id = seq_id
        self.ceiling_tokens = ceiling_tokens
        super().__init__(
            f"sequence {seq_id!r} would hold {needed} tokens, above its ceiling of "
            f"{ceiling_tokens}; compact its context or raise the ceiling",
            needed=needed,
            available=ceiling_tokens,
        )


class ModelError(EngineError):
    """The model cannot be built: its config, its weights or its preset name is wrong."""


class ModelConfigError(ModelError):
    """A model config is missing, malformed or asks for something the engine lacks.

    ``problem`` says what is wrong and what to do; ``path`` is the file or folder read,
    or None for a config built in code.
    """

    def __init__(self, problem: str, *, path: str | None = None) -> None:
        self.problem = problem
        self.path = path
        super().__init__(problem if path is None else f"{path}: {problem}")


class ModelLoadError(ModelError):
    """The weights in a model folder do not fit the model its config.json describes.

    Every offending tensor is named at once: ``missing`` (the model needs it, no file has
    it), ``unexpected`` (a file has it, the model has no place for it), ``mismatched``
    (``(name, expected_shape, found_shape)``) and ``bad_dtypes`` (``(name, dtype)`` for
    tensors that are not floating point). ``problem`` covers folder-level faults such as
    a folder with no ``*.safetensors`` file.
    """

    def __init__(
        self,
        path: str,
        *,
        problem: str | None = None,
        missing: tuple[str, ...] = (),
        unexpected: tuple[str, ...] = (),
        mismatched: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = (),
        bad_dtypes: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.path = path
        self.problem = problem
        self.missing = missing
        self.unexpected = unexpected
        self.mismatched = mismatched
        self.bad_dtypes = bad_dtypes
        parts = [] if problem is None else [problem]
        if missing:
            parts.append(f"{len(missing)} missing tensor(s): {', '.join(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected tensor(s): {', '.join(unexpected)}")
        if mismatched:
            shapes = ", ".join(
                f"{name} (expected {list(want)}, found {list(got)})"
                for name, want, got in mismatched
            )
            parts.append(f"{len(mismatched)} tensor(s) with the wrong shape: {shapes}")
        if bad_dtypes:
            kinds = ", ".join(f"{name} ({dtype})" for name, dtype in bad_dtypes)
            parts.append(
                f"{len(bad_dtypes)} tensor(s) that are not floating point (quantized "
                f"checkpoints are not supported): {kinds}"
            )
        hint = (
            ""
            if problem is not None
            else "; the checkpoint does not match its config.json: re-export the model "
            "or fix the config"
        )
        super().__init__(f"cannot load model from {path}: {'; '.join(parts)}{hint}")


class WeightsDoNotFitError(ModelError):
    """The model's weights are larger than the memory free where they would go: refused
    before anything is allocated (an out-of-memory kill or a half-built model otherwise).
    ``needed`` is a lower bound (quantization scales, buffers and activations not
    counted); ``available`` what the device has free."""

    def __init__(self, model: str, *, needed: int, available: int, device: str, dtype: str) -> None:
        self.model = model
        self.needed = needed
        self.available = available
        self.device = device
        super().__init__(
            f"{model!r} needs at least {needed / 1e9:.1f} GB for its weights in {dtype} and "
            f"{device} has {available / 1e9:.1f} GB free; run it on a larger device, in "
            "bfloat16 (dtype), with quantize='int4' or 'int8', or pick a smaller model"
        )


class UnknownPresetError(ModelError, KeyError):
    def __init__(self, name: str, available: tuple[str, ...]) -> None:
        self.name = name
        self.available = available
        super().__init__(
            f"no built-in preset named {name!r}; available presets: {', '.join(available)}; "
            "or pass the path of a local Hugging Face model folder"
        )

    def __str__(self) -> str:  # KeyError would otherwise print the repr of the message
        return str(self.args[0])


class TokenizerLoadError(ModelError):
    """A tokenizer cannot be loaded from ``spec`` (a folder or ``tiktoken:<encoding>``)."""

    def __init__(self, spec: str, problem: str) -> None:
        self.spec = spec
        self.problem = problem
        super().__init__(f"cannot load tokenizer {spec!r}: {problem}")
