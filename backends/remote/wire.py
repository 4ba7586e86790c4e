"""The wire format between ``kvgov serve`` and ``RemoteBackend``: pydantic models of the
control plane under ``/kvgov/v1`` and of kvgov's extras on the OpenAI routes.

One module, imported by both ends, so the two cannot drift apart. It needs only pydantic
(no torch): the governor side runs where the agents run.

Control plane (every ``Backend`` call that ``LocalBackend`` makes has one):

====== ======================================== ================== ====================
method path                                     body               answer
====== ======================================== ================== ====================
GET    /kvgov/v1/capacity                       -                  ``Capacity``
POST   /kvgov/v1/budgets                        ``BudgetSpec``     ``BudgetSpec`` (201)
PUT    /kvgov/v1/budgets/{name}                 ``BudgetResize``   ``BudgetSpec``
DELETE /kvgov/v1/budgets/{name}                 -                  204
POST   /kvgov/v1/budgets/{name}/retain          -                  ``Retained``
POST   /kvgov/v1/budgets/{name}/release         -                  204
POST   /kvgov/v1/budgets/{name}/offload         -                  204
POST   /kvgov/v1/budgets/{name}/restore         -                  204
POST   /kvgov/v1/prefixes                       ``PinRequest``     ``Prefix`` (201)
DELETE /kvgov/v1/prefixes/{key}                 -                  204
POST   /kvgov/v1/count                          ``CountRequest``   ``Count``
GET    /kvgov/v1/metrics                        -                  ``Metrics``
GET    /kvgov/v1/kv                             -                  ``KVMap``
GET    /kvgov/v1/tokenizer                      -                  ``TokenizerInfo``
====== ======================================== ================== ====================

Budget names and prefix keys are per API key on the server (one tenant never sees or
closes another's). A name is one path segment, escaped by the client; ``name_problem``
is the rule for what a name may be, the same at both ends. Errors on every route are
OpenAI-shaped (``ErrorBody``); kvgov's own errors add ``kvgov`` (``ErrorDetail``): the
engine's error class and fields, so the client raises the matching typed error.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "INSTANCE_HEADER",
    "KVGOV_FINISH_REASONS",
    "MAX_NAME_CHARS",
    "BudgetResize",
    "BudgetSpec",
    "Capacity",
    "Count",
    "CountRequest",
    "ErrorBody",
    "ErrorDetail",
    "ErrorInfo",
    "Holds",
    "KVBudget",
    "KVMap",
    "Metrics",
    "PinRequest",
    "Prefix",
    "Retained",
    "TokenizerInfo",
    "name_problem",
]

# Every control-plane answer names the server instance that gave it (a new id each time
# the server starts): a client that sees it change knows its budgets, pins and holds
# are gone. ``/health`` and ``/version`` carry it as ``instance_id``.
INSTANCE_HEADER = "x-kvgov-instance"

# finish reasons a kvgov choice may carry in ``kvgov_finish_reason``; OpenAI's own
# ``finish_reason`` says "length" for "ceiling" and "budget".
KVGOV_FINISH_REASONS = ("stop", "length", "ceiling", "budget", "abort")


# The longest budget name either end takes (``BudgetSpec.name``).
MAX_NAME_CHARS = 256


def name_problem(name: object) -> str | None:
    """What makes ``name`` unfit as a budget name (or a prefix key) in a control-plane
    path, or ``None`` when it is fit: the rule ``kvgov serve`` holds names to
    (``kvgov.serve.tenancy.check_budget_name``), for a client to refuse a name before
    it sends anything. A name is one path segment: a ``/`` would make it two
    (``../prefixes/k`` reaches another route) and ``.`` or ``..`` none; control and
    bidirectional-format characters would reach logs and ``/metrics`` labels as they
    are, so a name is printable (``str.isprintable``: no Unicode ``C*`` or ``Z*`` but
    the space), and it has no spaces at either end."""
    if not isinstance(name, str):
        return f"a name is a string, not {type(name).__name__}"
    if not 1 <= len(name) <= MAX_NAME_CHARS:
        return f"it has {len(name)} characters; use 1 to {MAX_NAME_CHARS}"
    if "/" in name or name in (".", ".."):
        return "it is or holds a path segment ('/', '.' or '..'); use another character"
    if name != name.strip():
        return "it starts or ends with a space; strip it"
    if not name.isprintable():
        bad = next(char for char in name if not char.isprintable())
        return (
            f"it holds the character U+{ord(bad):04X}, which is not printable (control, "
            "format and bidi characters are refused)"
        )
    return None


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capacity(_Body):
    block_size: int
    num_blocks: int
    num_free_blocks: int
    num_pinned_blocks: int
    bytes_per_block: int
    max_model_len: int
    weights_bytes: int = 0


class BudgetSpec(_Body):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    max_blocks: int = Field(ge=1)


class BudgetResize(_Body):
    max_blocks: int = Field(ge=1)


class Retained(_Body):
    tokens: int  # tokens held (0 when nothing was left to hold)


class PinRequest(_Body):
    # text, token ids, or chat messages (rendered with no generation prompt)
    prefix: str | list[int] | list[dict[str, Any]]
    cache_salt: str | None = None
    # Every tenant's calls that start with it reuse its blocks (no cache_salt then); on a
    # server with API keys only an admin key may pin shared (kvgov.serve.control).
    shared: bool = False


class Prefix(_Body):
    key: str
    num_tokens: int
    num_pinned_tokens: int
    num_blocks: int
    cache_salt: str | None = None
    shared: bool = False


class CountRequest(_Body):
    # exactly one: plain text, or chat messages (template overhead included)
    text: str | None = None
    messages: list[dict[str, Any]] | None = None


class Count(_Body):
    tokens: int


class Metrics(_Body):
    num_blocks_in_use: int
    num_blocks_free: int
    num_blocks_cached: int
    num_blocks_pinned: int
    num_blocks_swapped: int
    num_requests_running: int
    num_requests_waiting: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_tokens_in_use: int = 0
    num_holds_reclaimed: int = 0


class KVBudget(_Body):
    device_block_ids: list[int]
    num_device_tokens: int
    num_host_blocks: int
    max_blocks: int


class Holds(_Body):
    """The caller's held contexts: budget -> on the host (offloaded)."""

    holds: dict[str, bool]


class KVMap(_Body):
    """``Engine.kv_snapshot`` over the wire: the pool at one instant between two steps."""

    budgets: dict[str, KVBudget]
    pinned_block_ids: list[int]
    num_blocks: int
    num_blocks_in_use: int
    num_tokens_in_use: int


class TokenizerInfo(_Body):
    """How a client can count exactly as the server does without a round trip: a tiktoken
    encoding by name, or a Hugging Face ``tokenizer.json`` fetched once; ``None`` kind:
    count through ``/kvgov/v1/count``."""

    kind: Literal["tiktoken", "huggingface", "none"]
    encoding: str | None = None  # for tiktoken
    tokenizer_json: str | None = None  # for huggingface


class ErrorDetail(_Body):
    error_class: str  # the engine's error class name, e.g. "BudgetExceededError"
    fields: dict[str, Any] = {}  # its fields: needed, available, name...
    retriable: bool = False


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    message: str
    type: str  # OpenAI's: invalid_request_error, authentication_error, ...
    param: str | None = None
    code: str | None = None
    kvgov: ErrorDetail | None = None


class ErrorBody(BaseModel):
    error: ErrorInfo
