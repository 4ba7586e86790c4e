"""The control plane under ``/kvgov/v1``: every call ``LocalBackend`` makes, over HTTP.

Request and response bodies are the models of ``backends.remote.wire`` (its docstring has
the route table), which ``RemoteBackend`` sends and reads. Every handler is a plain
``def``: Starlette runs it on its thread pool, so the event loop never waits for the
engine thread's next step. Budget names and prefix keys are the tenant's own
(``kvgov.serve.tenancy``). Each change is recorded in the server's event log: budgets
opened, resized and closed; KV retained, released, offloaded and restored; prefixes
pinned and unpinned.

Shared prefixes. ``PinRequest.shared`` pins a prefix hashed unsalted: every tenant's call
whose prompt starts with its full blocks reuses them, and each tenant's own blocks start
right after it, salted as before (the engine works out, per call, how many leading
blocks are a shared pin's: ``engine.prefix_hash``). So a shared pin reveals nothing of
any tenant's prompt beyond the pinned tokens themselves, which are public by design.

Who may pin shared: on a server without API keys, anyone (there is one tenant; its
clients already share one cache). With keys, only an admin key
(``ServeSettings.admin_api_keys``, ``kvgov serve --admin-api-key``); other keys get 403.
Letting every tenant pin shared would be a probe: a tenant could pin a guess of another
tenant's system prompt and watch the server-wide hit counters (``/metrics``) rise when
that tenant's calls start with it. An admin pins what the operator chose to make public.
A shared pin belongs to the key that pinned it: only that key unpins it.

Pin shares. A bound key's own pins (``ServeSettings``: a key that is not an admin's) may
hold at most its share of the pool (``ServeSettings.tenant_pin_cap``): the server
tokenizes the prefix, reserves its full blocks against the share (403
``pin_share_exceeded`` past it) and pins the ids it counted, so no key's pins can leave
another key's prompts without room. An admin key and a server without keys pin as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request

from backends.remote import wire
from governor.backend import PrefixHandle
from governor.errors import BackendError, ConfigError
from kvgov.serve.errors import ApiError
from kvgov.serve.state import ServerState
from kvgov.serve.tenancy import (
    cache_salt_for,
    check_budget_name,
    scoped_budget,
    tenant_of,
    unscoped_budget,
)

__all__ = ["router"]


router = APIRouter(prefix="/kvgov/v1")


class UnknownPrefixError(BackendError):
    """No pin with that key for this tenant (never pinned, unpinned, or another's)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"no prefix {key!r} is pinned for this API key; unpin each key once, with the "
            "key that pinned it",
            backend="kvgov serve",
        )


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.kvgov
    return state


def _budget(request: Request, name: str) -> tuple[ServerState, str, str]:
    check_budget_name(name)
    tenant = tenant_of(request)
    return _state(request), tenant, scoped_budget(tenant, name)


# -- capacity and metrics ---------------------------------------------------------------
@router.get("/capacity")
def capacity(request: Request) -> wire.Capacity:
    cap = _state(request).backend.capacity()
    return wire.Capacity(
        block_size=cap.block_size,
        num_blocks=cap.num_blocks,
        num_free_blocks=cap.num_free_blocks,
        num_pinned_blocks=cap.num_pinned_blocks,
        bytes_per_block=cap.bytes_per_block,
        max_model_len=cap.max_model_len,
        weights_bytes=cap.weights_bytes,
    )


@router.get("/metrics")
def metrics(request: Request) -> wire.Metrics:
    return wire.Metrics(**asdict(_state(request).backend.metrics()))


@router.get("/holds")
def holds(request: Request) -> wire.Holds:
    """The caller's held contexts, budget -> offloaded: which the engine moved to host
    memory or ended itself for a running request (``governor.idle`` reads it)."""
    tenant = tenant_of(request)
    held = _state(request).backend.held_contexts().items()
    names = ((unscoped_budget(tenant, budget), offloaded) for budget, offloaded in held)
    return wire.Holds(holds={name: offloaded for name, offloaded in names if name is not None})


@router.get("/kv")
def kv(request: Request) -> wire.KVMap:
    """The pool at one instant; only the caller's own budgets are listed."""
    tenant = tenant_of(request)
    snap = _state(request).backend.kv_snapshot()
    budgets = {}
    for engine_name, blocks in snap.budgets.items():
        name = unscoped_budget(tenant, engine_name)
        if name is not None:
            budgets[name] = wire.KVBudget(
                device_block_ids=sorted(blocks.device_block_ids),
                num_device_tokens=blocks.num_device_tokens,
                num_host_blocks=blocks.num_host_blocks,
                max_blocks=blocks.max_blocks,
            )
    return wire.KVMap(
        budgets=budgets,
        pinned_block_ids=sorted(snap.pinned_block_ids),
        num_blocks=snap.num_blocks,
        num_blocks_in_use=snap.num_blocks_in_use,
        num_tokens_in_use=snap.num_tokens_in_use,
    )


# -- budgets ----------------------------------------------------------------------------
@router.post("/budgets", status_code=201)
def open_budget(request: Request, spec: wire.BudgetSpec) -> wire.BudgetSpec:
    state, tenant, engine_name = _budget(request, spec.name)
    state.backend.open_budget(engine_name, max_blocks=spec.max_blocks)
    state.events.record(
        "budget.opened", tenant=tenant, budget=spec.name, max_blocks=spec.max_blocks
    )
    return spec


@router.put("/budgets/{name}")
def resize_budget(request: Request, name: str, resize: wire.BudgetResize) -> wire.BudgetSpec:
    state, tenant, engine_name = _budget(request, name)
    state.backend.resize_budget(engine_name, max_blocks=resize.max_blocks)
    state.events.record("budget.resized", tenant=tenant, budget=name, max_blocks=resize.max_blocks)
    return wire.BudgetSpec(name=name, max_blocks=resize.max_blocks)


@router.delete("/budgets/{name}", status_code=204)
def close_budget(request: Request, name: str) -> None:
    state, tenant, engine_name = _budget(request, name)
    state.backend.close_budget(engine_name)
    state.events.record("budget.closed", tenant=tenant, budget=name)


@router.post("/budgets/{name}/retain")
def retain(request: Request, name: str) -> wire.Retained:
    state, tenant, engine_name = _budget(request, name)
    tokens = state.backend.retain(budget=engine_name)
    state.events.record("kv.retained", tenant=tenant, budget=name, tokens=tokens)
    return wire.Retained(tokens=tokens)


@router.post("/budgets/{name}/release", status_code=204)
def release_retained(request: Request, name: str) -> None:
    state, tenant, engine_name = _budget(request, name)
    state.backend.release_retained(budget=engine_name)
    state.events.record("kv.released", tenant=tenant, budget=name)


@router.post("/budgets/{name}/offload", status_code=204)
def offload(request: Request, name: str) -> None:
    state, tenant, engine_name = _budget(request, name)
    state.backend.offload(budget=engine_name)
    state.events.record("kv.offloaded", tenant=tenant, budget=name)


@router.post("/budgets/{name}/restore", status_code=204)
def restore(request: Request, name: str) -> None:
    state, tenant, engine_name = _budget(request, name)
    state.backend.restore(budget=engine_name)
    state.events.record("kv.restored", tenant=tenant, budget=name)


# -- prefixes ---------------------------------------------------------------------------
@router.post("/prefixes", status_code=201)
def pin_prefix(request: Request, pin: wire.PinRequest) -> wire.Prefix:
    state, tenant = _state(request), tenant_of(request)
    if pin.shared:
        _check_may_pin_shared(state, tenant, pin)
        handle = state.backend.pin_prefix(pin.prefix, shared=True)
        state.pins.add(tenant, handle)
    else:
        handle = _pin_own(state, tenant, pin.prefix, cache_salt_for(tenant, pin.cache_salt))
    state.events.record(
        "prefix.pinned",
        tenant=tenant,
        key=handle.key,
        num_pinned_tokens=handle.num_pinned_tokens,
        shared=pin.shared,
    )
    # The client's own salt: what it sends with the calls that start with this prefix,
    # which the server salts the same way.
    return wire.Prefix(
        key=handle.key,
        num_tokens=handle.num_tokens,
        num_pinned_tokens=handle.num_pinned_tokens,
        num_blocks=handle.num_blocks,
        cache_salt=pin.cache_salt,
        shared=pin.shared,
    )


_Prefix = str | list[int] | list[dict[str, Any]]  # backends.remote.wire.PinRequest's


def _pin_own(state: ServerState, tenant: str, prefix: _Prefix, salt: str | None) -> PrefixHandle:
    """The tenant's own pin, held to its share of the pool when the tenant is bound."""
    if not state.is_bound(tenant):
        handle = state.backend.pin_prefix(prefix, cache_salt=salt)
        state.pins.add(tenant, handle)
        return handle
    ids = _token_ids(state, prefix)
    cap = state.backend.capacity()
    num_blocks = len(ids) // cap.block_size  # the full blocks: what a pin holds
    state.pins.reserve(tenant, num_blocks, cap=state.settings.tenant_pin_cap(cap.num_blocks))
    try:
        handle = state.backend.pin_prefix(ids, cache_salt=salt)
    except BaseException:
        state.pins.cancel(tenant, num_blocks)
        raise
    state.pins.add(tenant, handle, reserved=num_blocks)
    return handle


def _token_ids(state: ServerState, prefix: _Prefix) -> list[int]:
    """The ids ``LocalBackend.pin_prefix`` would pin for ``prefix`` (chat messages
    rendered with no generation prompt)."""
    tokenizer = state.backend.tokenizer
    if isinstance(prefix, str):
        return tokenizer.encode(prefix)
    if prefix and isinstance(prefix[0], Mapping):
        return tokenizer.encode_chat(prefix, add_generation_prompt=False)
    return list(prefix)  # type: ignore[arg-type]  # neither text nor messages: token ids


def _check_may_pin_shared(state: ServerState, tenant: str, pin: wire.PinRequest) -> None:
    if pin.cache_salt is not None:
        raise ApiError(
            400,
            "a shared prefix is hashed with no salt, so every tenant's calls reuse it: send "
            "shared or cache_salt, not both",
            code="invalid_request",
            param="cache_salt",
        )
    if state.is_bound(tenant):
        raise ApiError(
            403,
            "only an admin API key may pin a prefix shared by every tenant (kvgov serve "
            "--admin-api-key); pin it without shared to reuse it in your own calls",
            code="shared_pin_forbidden",
            param="shared",
        )


@router.delete("/prefixes/{key}", status_code=204)
def unpin_prefix(request: Request, key: str) -> None:
    state, tenant = _state(request), tenant_of(request)
    handle = state.pins.take(tenant, key)
    if handle is None:
        raise UnknownPrefixError(key)
    try:
        state.backend.unpin_prefix(handle)
    except BaseException:
        state.pins.put_back(tenant, handle)
        raise
    state.events.record("prefix.unpinned", tenant=tenant, key=key)


# -- tokens -----------------------------------------------------------------------------
@router.post("/count")
def count(request: Request, body: wire.CountRequest) -> wire.Count:
    backend = _state(request).backend
    if (body.text is None) == (body.messages is None):
        raise _one_of_text_and_messages()
    if body.messages is not None:
        return wire.Count(tokens=backend.count_messages(body.messages))
    return wire.Count(tokens=backend.count_tokens(body.text or ""))


@router.get("/tokenizer")
def tokenizer(request: Request) -> wire.TokenizerInfo:
    """A tiktoken encoding counts text on the client exactly as here; chat messages go
    through the chat template, so clients count those with ``/count``."""
    name = _state(request).backend.counter.name
    if name.startswith("tiktoken:"):
        return wire.TokenizerInfo(kind="tiktoken", encoding=name.removeprefix("tiktoken:"))
    return wire.TokenizerInfo(kind="none")


def _one_of_text_and_messages() -> ConfigError:
    return ConfigError("send exactly one of text and messages to count", setting="text")
