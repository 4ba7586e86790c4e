"""``LlamaCppBackend``: ``OpenAICompatibleBackend`` for llama.cpp's ``llama-server``.

It reads capacity and pressure from ``/props``, ``/slots`` and ``/metrics``. A ceiling is a
slot's share of the context (split per slot, the default) or a share of one pool
(``kv_unified=True``); each budget keeps the slot that holds its prompt (``id_slot``),
which also keeps tenants apart (llama-server has no cache salt); offload and restore are
slot save and restore, to files no other backend, tenant or budget writes. What it reads,
the two KV layouts, the levers, counting and restarts: docs/guides/external-engines.md.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping
from typing import Any

from backends.http.probe import EngineReading
from backends.openai._limits import Call
from backends.openai._llamacpp_probe import LlamaCppProbe
from backends.openai._llamacpp_slots import SlotTable, slot_filename
from backends.openai.backend import OpenAICompatibleBackend
from governor import GenerationRequest, GenerationResult

__all__ = ["LlamaCppBackend"]


class LlamaCppBackend(OpenAICompatibleBackend):
    """llama-server at ``base_url``. ``model``: the name sent (llama-server serves the one
    it loaded whatever it is told). ``kv_unified``: the server runs with ``--kv-unified``.
    Other keywords as ``OpenAICompatibleBackend``'s."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "llama.cpp",
        kv_unified: bool = False,
        **options: Any,
    ) -> None:
        options.setdefault("probe", LlamaCppProbe(kv_unified=kv_unified))
        self.kv_unified = kv_unified
        self._slots = SlotTable()
        self._lock = threading.Lock()
        self._tokens: dict[str, int] = {}  # budget -> tokens its slot holds after its last call
        self._saved: dict[str, tuple[str, int]] = {}  # budget -> (file, tokens) saved
        self._switching: set[str] = set()  # budgets whose call overwrites another tenant's
        super().__init__(base_url, model=model, **options)
        # Which backend saved a slot file: another one on the same server (in this process
        # or any other) may have a budget of the same name.
        self._identity = f"{self.base_url} {secrets.token_hex(16)}"

    @property
    def name(self) -> str:
        return "llama.cpp"

    def slot_of(self, budget: str) -> int | None:
        """The slot the budget's calls go to (None before its first call)."""
        return self._slots.slot_of(budget)

    def slot_owners(self) -> dict[int, str | None]:
        """Each slot's budget now (None: free)."""
        return self._slots.owners()

    # -- levers -------------------------------------------------------------------------------
    def close_budget(self, name: str) -> None:
        self._slots.release(name, closed=True)
        with self._lock:
            self._tokens.pop(name, None)
            self._saved.pop(name, None)
        super().close_budget(name)

    def retain(self, *, budget: str) -> int:
        if self._slots.hold(budget, True) is None:
            return 0
        with self._lock:
            return self._tokens.get(budget, 0)

    def release_retained(self, *, budget: str) -> None:
        self._slots.hold(budget, False)

    def offload(self, *, budget: str) -> None:
        """Save the budget's slot to the server's ``--slot-save-path`` and free the slot."""
        slot = self._slots.slot_of(budget)
        if slot is None:
            return
        tenant = self._slots.tenant_of(budget)
        filename = slot_filename(backend=self._identity, cache_salt=tenant, budget=budget)
        self._before()
        self._send(f"/slots/{slot}?action=save", {"filename": filename})
        self._send(f"/slots/{slot}?action=erase", {})
        self._slots.erased(slot)
        self._slots.release(budget)
        with self._lock:
            self._saved[budget] = (filename, self._tokens.get(budget, 0))

    def restore(self, *, budget: str) -> None:
        """Load the budget's saved slot into a free slot, which it then keeps; with none
        free its next call prefills again."""
        with self._lock:
            saved = self._saved.pop(budget, None)
        if saved is None:
            return
        self._sync_slots()
        slot = self._slots.take_for(budget)
        if slot is None:
            return
        self._before()
        self._send(f"/slots/{slot}?action=restore", {"filename": saved[0]})

    # -- OpenAICompatibleBackend's hooks ---------------------------------------------------
    def _extras(self, request: GenerationRequest, body: dict[str, Any]) -> None:
        body["cache_prompt"] = True
        if request.budget is None:
            return
        self._sync_slots()
        slot, erase = self._slots.begin(request.budget, request.cache_salt)
        if slot is None:
            return
        body["id_slot"] = slot
        if erase:  # it holds another tenant's KV, which this call must never hit
            body["cache_prompt"] = False  # evaluated whole, and the slot now holds it
            with self._lock:
                self._switching.add(request.budget)

    def _done(self, call: Call) -> None:
        if call.budget is not None:
            with self._lock:
                failed = call.budget in self._switching
                self._switching.discard(call.budget)
            if failed:  # the slot may still hold the other tenant's KV
                self._slots.taint_of(call.budget)
            self._slots.end(call.budget)
        super()._done(call)

    def _result(self, call: Call, result: GenerationResult) -> GenerationResult:
        if call.budget is not None:
            with self._lock:
                self._tokens[call.budget] = result.prompt_tokens + result.completion_tokens
                self._switching.discard(call.budget)
        return super()._result(call, result)

    def _num_blocks(self, reading: EngineReading, tokens: int) -> int:
        slots = len(reading.slots) or 1
        if self.kv_unified or reading.max_model_len is None:
            return tokens // self.block_size
        return slots * (reading.max_model_len // self.block_size)  # whole blocks per slot

    def _num_blocks_swapped(self) -> int:
        with self._lock:
            tokens = sum(saved[1] for saved in self._saved.values())
        return -(-tokens // self.block_size)

    def _engine_state_lost(self) -> None:
        self._slots.forget()
        with self._lock:
            self._tokens.clear()
            self._saved.clear()

    def _count(self, body: Mapping[str, Any]) -> int:
        if "messages" in body:
            answer = self._transport.request(
                "POST", "/apply-template", json={"messages": body["messages"]}, idempotent=True
            ).json()
            sent = {"content": answer["prompt"], "add_special": True, "parse_special": True}
        else:
            sent = {"content": body["text"]}
        answer = self._transport.request("POST", "/tokenize", json=sent, idempotent=True).json()
        return len(answer.get("tokens") or ())

    def _sync_slots(self) -> None:
        reading = self.reading()
        ids = [slot.id for slot in reading.slots]
        if not ids and isinstance(reading.raw, dict):
            ids = list(range(int(reading.raw.get("props_total_slots") or 0)))
        if ids:
            self._slots.resize(ids)
