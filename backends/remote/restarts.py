"""``Restarts``: how ``RemoteBackend`` (and ``OpenAICompatibleBackend``, which overrides
``_probe`` and ``_set_up`` for an engine of its own) makes each call, and survives a
server restart.

Every call goes: check first (``_before``), send, then look at what came back.

- Before: a call that failed to reach the server made the session suspect; the next
  call first asks ``/version`` for the instance id. A new id (seen there or on any
  answer's ``x-kvgov-instance``) is a restart: the session's budgets are opened again at
  their last sizes and its prefixes pinned again (under ``_restarting``, one thread at a
  time), then the ``on_restart`` hooks run. Closes and unpins the server missed are sent
  to the same server once it answers.
- A call that cannot reach the server (or whose connection breaks) raises
  ``BackendUnavailable``: it may have run or not, so it is never retried blindly.
- A call refused for an unknown budget or prefix the session knows may have met a
  restarted server: the instance is checked at once, and after a restart the refusal is
  raised as ``BackendUnavailable`` (retriable: the budget is back now).

Async calls do the same; what waits on the sync client (setting things up again) runs
on a worker thread, so an event loop never waits. Lock order: ``_restarting``, then the
session's leaf lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from backends.remote._paths import API, budget_path, prefix_path
from governor import BackendError, BackendUnavailable

if TYPE_CHECKING:
    from backends.http import Reply
    from backends.http.transport import Transport
    from backends.remote.session import Pin, Session

__all__ = ["Restarts"]

_MAY_BE_RESTART = frozenset({"UnknownBudgetError", "UnknownPrefixError", "UnknownPinError"})


class Restarts:
    """Mixed into a backend, whose ``name``, ``_session`` and ``_transport`` it uses."""

    _session: Session
    _transport: Transport

    if TYPE_CHECKING:  # the backend's own read-only property

        @property
        def name(self) -> str: ...

    def __init__(self) -> None:
        self._closed = False
        self._restarting = threading.Lock()
        self._hooks: list[Callable[[], None]] = []

    @property
    def num_restarts(self) -> int:
        """Server restarts this client has noticed and set itself up again after."""
        return self._session.num_restarts

    def on_restart(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook()`` after each restart, once budgets and prefixes are back (on the
        thread that noticed it); returns the function that removes it."""
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook) if hook in self._hooks else None

    # -- a call ---------------------------------------------------------------------------
    def _call(
        self, method: str, path: str, json: Any = None, *, idempotent: bool | None = None
    ) -> httpx.Response | Reply:
        self._before()
        try:
            response = self._transport.request(method, path, json=json, idempotent=idempotent)
        except BackendError as exc:
            self._failed(exc)
            raise
        if self._session.restart_pending:
            self._set_up_again()
        return response

    async def _acall(
        self, method: str, path: str, json: Any = None, *, idempotent: bool | None = None
    ) -> httpx.Response | Reply:
        await self._abefore()
        try:
            response = await self._transport.arequest(
                method, path, json=json, idempotent=idempotent
            )
        except BackendError as exc:
            await asyncio.to_thread(self._failed, exc)
            raise
        if self._session.restart_pending:
            await asyncio.to_thread(self._set_up_again)
        return response

    def _before(self) -> None:
        if self._closed:
            raise BackendError(
                f"this {type(self).__name__} is closed; create a new one", backend=self.name
            )
        session = self._session
        if session.suspect:
            self._probe()
        if session.restart_pending:
            self._set_up_again()
        if session.has_pending:
            self._send_pending()

    async def _abefore(self) -> None:
        session = self._session
        if self._closed or session.suspect or session.restart_pending or session.has_pending:
            await asyncio.to_thread(self._before)

    def _failed(self, exc: BackendError) -> None:
        """After a failed call: mark the session suspect, or check for a restart; a
        refusal that came from a restart is raised as ``BackendUnavailable``."""
        if isinstance(exc, BackendUnavailable):
            self._session.suspect = True
            return
        if type(exc).__name__ not in _MAY_BE_RESTART:
            return
        restarts = self._session.num_restarts
        try:
            self._probe()
            if self._session.restart_pending:
                self._set_up_again()
        except BackendError:
            return
        if self._session.num_restarts != restarts:
            raise BackendUnavailable(
                f"the server restarted and lost this call's state ({exc}); budgets and "
                "prefixes are set up again",
                backend=self.name,
            ) from exc

    # -- a restart ------------------------------------------------------------------------
    def _probe(self) -> None:
        """Ask the server who it is (raises ``BackendUnavailable`` while it is away)."""
        response = self._transport.request("GET", "/version")
        self._session.observe(str(response.json()["instance_id"]))
        self._session.suspect = False

    def _set_up_again(self) -> None:
        session = self._session
        with self._restarting:
            if not session.restart_pending:
                return  # another thread did it meanwhile
            self._set_up(*session.to_restore())
            with session.lock:
                session.restart_pending = False
                session.num_restarts += 1
        for hook in list(self._hooks):
            hook()

    def _set_up(self, budgets: dict[str, int], pins: dict[str, Pin]) -> None:
        """Open ``budgets`` and pin ``pins`` on the restarted server (under ``_restarting``)."""
        session = self._session
        for name, max_blocks in budgets.items():
            try:
                body = {"name": name, "max_blocks": max_blocks}
                self._transport.request("POST", f"{API}/budgets", json=body)
            except BackendError as exc:
                if type(exc).__name__ != "DuplicateBudgetError":
                    raise  # restart_pending stays: the next call tries again
                # opened meanwhile by a call on the new server: only its size to check
                path = budget_path(name, backend=self.name)
                self._transport.request("PUT", path, json={"max_blocks": max_blocks})
        for key, pin in pins.items():
            if session.server_key(key) != pin.server_key:
                continue  # unpinned, or pinned again, meanwhile
            pin.server_key = self._pin_direct(pin.prefix, pin.cache_salt, pin.shared)

    def _pin_direct(self, prefix: Any, cache_salt: str | None, shared: bool = False) -> str:
        body = {"prefix": prefix, "cache_salt": cache_salt, "shared": shared}
        response = self._transport.request("POST", f"{API}/prefixes", json=body)
        return str(response.json()["key"])

    def _send_pending(self) -> None:
        session = self._session
        closes, unpins = session.take_pending()
        sends = [
            (budget_path(name, backend=self.name), session.pending_closes, name) for name in closes
        ]
        sends += [
            (prefix_path(key, backend=self.name), session.pending_unpins, key) for key in unpins
        ]
        for path, pending, item in sends:
            try:
                self._transport.request("DELETE", path)
            except BackendUnavailable:  # still away: kept for later (a restart drops it)
                with session.lock:
                    pending.add(item)
                session.suspect = True
            except BackendError:  # gone already
                pass
