"""``kvgov map``: where the card's memory goes, drawn as two bars.

The top bar is the contiguous reserve-for-max cache: after the weights and the runtime
overhead, each agent reserves its ceiling up front; the part of a reservation it does
not use is wasted, and agents whose reservation does not fit stand past the admission
wall. The bottom bar is the paged cache kvgov runs: each agent holds only the blocks its
live context fills, a shared prefix is held once, and the rest is free headroom for more
agents or longer contexts. KV offloaded to host memory is drawn on a third bar, off the
card. A caption gives the figures.

A ``MemoryMap`` comes from ``kvgov plan`` inputs (``from_plan``: every agent at the
average) or from a run's record (``from_record``; the demo writes one from the engine's
blocks at the instant its blocks in use peaked, so its paged bar is what the card held
then and never passes the KV budget). ``render`` writes SVG and PNG with matplotlib
(imported only there). The same functions are ``MemoryMap`` methods:
``MemoryMap.from_plan``, ``load``, ``save``, ``caption`` and ``render``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from governor.errors import ConfigError
from governor.plan import GB, Plan

__all__ = [
    "AgentMemory",
    "MemoryMap",
    "caption",
    "from_plan",
    "from_record",
    "paged_bytes",
    "render",
    "write_record",
]


@dataclass(frozen=True, slots=True)
class AgentMemory:
    name: str
    live_bytes: int  # KV its context holds on the device (at the map's instant, or average)
    reserved_bytes: int  # what a contiguous cache would set aside for it: its ceiling
    shared_bytes: int = 0  # of its live KV, blocks it shares with others (paged: held once)
    offloaded_bytes: int = 0  # of its context, KV offloaded to host memory


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryMap:
    title: str
    card_bytes: int
    weights_bytes: int
    overhead_bytes: int
    agents: tuple[AgentMemory, ...]
    # Paged, the blocks shared between agents, held once; never less than one agent's
    # shared part (0 for a map whose agents share one prefix: the largest share is it).
    shared_bytes: int = 0
    # The same swarm on the paged engine alone (no governor), at that run's own peak of
    # blocks in use; drawn as a bar of its own when given.
    paged_alone: tuple[AgentMemory, ...] = ()
    paged_alone_shared_bytes: int = 0

    @property
    def kv_budget_bytes(self) -> int:
        return self.card_bytes - self.weights_bytes - self.overhead_bytes

    def contiguous_admitted(self) -> int:
        """Agents whose full reservations fit in the KV budget, in order."""
        used = admitted = 0
        for agent in self.agents:
            if used + agent.reserved_bytes > self.kv_budget_bytes:
                break
            used += agent.reserved_bytes
            admitted += 1
        return admitted

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_plan(cls, plan: Plan) -> MemoryMap:
        """Every agent at the plan's average context, against its ceiling."""
        return from_plan(plan)

    @classmethod
    def load(cls, record: Mapping[str, Any] | str | Path) -> MemoryMap:
        """A map saved by ``save`` (or its JSON as a mapping)."""
        return from_record(record)

    def save(self, path: str | Path) -> Path:
        """The map's inputs as JSON, for ``kvgov map --record``."""
        return write_record(self, path)

    def paged_bytes(self) -> int:
        """What the paged bar holds on the device (a shared block once)."""
        return paged_bytes(self)

    def caption(self) -> str:
        """The figures, in one paragraph."""
        return caption(self)

    def render(self, path: str | Path) -> tuple[Path, Path]:
        """Draw it: ``path`` with ``.svg`` and ``.png`` suffixes."""
        return render(self, path)


def from_plan(plan: Plan) -> MemoryMap:
    c = plan.comparison
    per_token = c.kv_shape.bytes_per_token
    block = c.kv_shape.bytes_per_block(c.block_size)
    live = -(-c.average_tokens // c.block_size) * block
    agents = tuple(
        AgentMemory(f"agent {i + 1}", live, c.ceiling_tokens * per_token)
        for i in range(c.num_agents)
    )
    return MemoryMap(
        title=f"{plan.model}: {c.num_agents} agents, ceiling {c.ceiling_tokens:,}, "
        f"average {c.average_tokens:,} tokens",
        card_bytes=plan.card_bytes,
        weights_bytes=plan.weights_bytes,
        overhead_bytes=plan.overhead_bytes,
        agents=agents,
    )


def from_record(record: Mapping[str, Any] | str | Path) -> MemoryMap:
    """A map from ``MemoryMap.to_json()`` output (a mapping, or a JSON file's path)."""
    data: Mapping[str, Any]
    if isinstance(record, Mapping):
        data = record
    else:
        try:
            data = json.loads(Path(record).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read a memory record from {record}: {exc}") from None
    try:
        agents = tuple(AgentMemory(**a) for a in data["agents"])
        return MemoryMap(
            title=str(data["title"]),
            card_bytes=int(data["card_bytes"]),
            weights_bytes=int(data["weights_bytes"]),
            overhead_bytes=int(data["overhead_bytes"]),
            agents=agents,
            shared_bytes=int(data.get("shared_bytes", 0)),
            paged_alone=tuple(AgentMemory(**a) for a in data.get("paged_alone", ())),
            paged_alone_shared_bytes=int(data.get("paged_alone_shared_bytes", 0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"a memory record needs title, card_bytes, weights_bytes, overhead_bytes and "
            f"agents (name, live_bytes, reserved_bytes); this one fails with {exc!r}"
        ) from None


def caption(memory: MemoryMap) -> str:
    admitted = memory.contiguous_admitted()
    agents = memory.agents
    reserved = sum(a.reserved_bytes for a in agents[:admitted])
    live_admitted = sum(_in_slot(a) for a in agents[:admitted])
    live = paged_bytes(memory)
    shared = _paged_shared(memory)
    offloaded = sum(a.offloaded_bytes for a in agents)
    waste = 1 - live_admitted / reserved if reserved else 0.0
    free = memory.kv_budget_bytes - live
    size, unit, digits = _unit(memory.card_bytes)

    def fmt(value: int) -> str:
        return f"{value / size:.{digits}f} {unit}"

    held_once = f" ({fmt(shared)} of it shared, held once)" if shared else ""
    host = f"; {fmt(offloaded)} offloaded to host memory" if offloaded else ""
    alone = ""
    if memory.paged_alone:
        n = len(memory.paged_alone)
        alone = (
            f" The paged engine alone, at its own peak: {n} agents hold "
            f"{fmt(_bar_bytes(memory.paged_alone, memory.paged_alone_shared_bytes))} of "
            "blocks on the device."
        )
    return (
        f"KV budget {fmt(memory.kv_budget_bytes)}. These contexts, each reserving its "
        f"agent's ceiling contiguously: {admitted} of {len(agents)} agents admitted, "
        f"{fmt(reserved)} reserved, {100 * waste:.0f}% of it unused. "
        f"Paged: {len(agents)} of {len(agents)} hold "
        f"{fmt(live)} of blocks on the device{held_once}, {fmt(max(free, 0))} free "
        f"headroom{host}.{alone}"
    )


def paged_bytes(memory: MemoryMap) -> int:
    """What the paged bar holds on the device: each agent's own blocks, and the shared
    ones once."""
    return _bar_bytes(memory.agents, memory.shared_bytes)


def _bar_bytes(agents: tuple[AgentMemory, ...], shared_bytes: int) -> int:
    return sum(a.live_bytes - a.shared_bytes for a in agents) + _shared(agents, shared_bytes)


def _paged_shared(memory: MemoryMap) -> int:
    return _shared(memory.agents, memory.shared_bytes)


def _shared(agents: tuple[AgentMemory, ...], shared_bytes: int) -> int:
    return max([shared_bytes, *(a.shared_bytes for a in agents)])


def _in_slot(agent: AgentMemory) -> int:
    """A contiguous slot keeps the whole context on the device, up to the ceiling."""
    return min(agent.live_bytes + agent.offloaded_bytes, agent.reserved_bytes)


def _unit(card_bytes: int) -> tuple[float, str, int]:
    """GB (1e9) for a card, MiB for the small budgets of the demo's CPU runs."""
    return (GB, "GB", 2) if card_bytes >= GB else (1 << 20, "MiB", 1)


def render(memory: MemoryMap, path: str | Path) -> tuple[Path, Path]:
    """Write ``path`` with ``.svg`` and ``.png`` suffixes; returns both paths."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    base = Path(path).with_suffix("")
    base.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(11, 4.2 if memory.paged_alone else 3.4), dpi=110)
    try:
        _draw(ax, memory, Patch)
        fig.suptitle(memory.title, fontsize=11, x=0.01, ha="left")
        fig.text(0.01, 0.02, caption(memory), fontsize=8.5, ha="left", wrap=True)
        fig.subplots_adjust(left=0.17, right=0.98, top=0.80, bottom=0.33)
        svg, png = base.with_suffix(".svg"), base.with_suffix(".png")
        fig.savefig(svg)
        fig.savefig(png)
    finally:
        plt.close(fig)
    return svg, png


_SHARED = "#7c3aed"
_HOST = "#f59e0b"
_WEIGHTS, _OVERHEAD, _LIVE, _WASTE, _FREE, _OUT = (
    "#6b7280",
    "#d1d5db",
    "#2563eb",
    "#fca5a5",
    "#dcfce7",
    "#ef4444",
)


def _draw(ax: Any, memory: MemoryMap, patch: Any) -> None:
    gb, unit, _ = _unit(memory.card_bytes)
    base = (memory.weights_bytes + memory.overhead_bytes) / gb
    card = memory.card_bytes / gb
    offloaded = sum(a.offloaded_bytes for a in memory.agents)
    alone = bool(memory.paged_alone)
    top = 2.0 if alone else 1.0
    # contiguous, kvgov, paged alone
    rows: tuple[float, ...] = (top, 0.0, 1.0) if alone else (top, 0.0)
    for y in rows:
        ax.barh(y, memory.weights_bytes / gb, color=_WEIGHTS, height=0.6)
        ax.barh(
            y,
            memory.overhead_bytes / gb,
            left=memory.weights_bytes / gb,
            color=_OVERHEAD,
            height=0.6,
        )
    admitted = memory.contiguous_admitted()
    left = base
    for i, agent in enumerate(memory.agents):
        reserved, live = agent.reserved_bytes / gb, _in_slot(agent) / gb
        fits = i < admitted
        ax.barh(
            rows[0],
            live,
            left=left,
            color=_LIVE if fits else "none",
            height=0.6,
            edgecolor="white" if fits else _OUT,
            linestyle="-" if fits else "--",
        )
        ax.barh(
            rows[0],
            reserved - live,
            left=left + live,
            height=0.6,
            color=_WASTE if fits else "none",
            edgecolor="white" if fits else _OUT,
            hatch="//" if fits else None,
            linestyle="-" if fits else "--",
        )
        left += reserved
    _paged_bar(ax, rows[1], memory.agents, memory.shared_bytes, base, card, gb)
    ticks, labels = list(rows), ["contiguous,\nreserve the ceiling", "paged (kvgov)"]
    if alone:
        _paged_bar(ax, rows[2], memory.paged_alone, memory.paged_alone_shared_bytes, base, card, gb)
        labels.append("paged engine alone\n(its own peak)")
    if offloaded:  # host memory: off the card, drawn from where the KV budget starts
        ax.barh(-1.0, offloaded / gb, left=base, color=_HOST, edgecolor="white", height=0.6)
        ticks.append(-1.0)
        labels.append("host memory\n(offloaded)")
    ax.axvline(card, color="black", linewidth=1.5)
    ax.text(card, top + 0.45, "admission wall (card full) ", fontsize=8, va="center", ha="right")
    ax.set_yticks(ticks, labels)
    ax.set_xlabel(unit)
    ax.set_ylim(-1.6 if offloaded else -0.6, top + 0.7)
    end = max(card, base + sum(a.reserved_bytes for a in memory.agents) / gb)
    ax.set_xlim(0, end * 1.02)
    handles = [
        patch(color=_WEIGHTS, label="weights"),
        patch(color=_OVERHEAD, label="runtime overhead"),
        patch(color=_LIVE, label="live KV"),
        patch(color=_SHARED, label="shared prefix"),
        patch(facecolor=_WASTE, hatch="//", label="reserved, unused"),
        patch(facecolor="none", edgecolor=_OUT, linestyle="--", label="not admitted"),
        patch(color=_FREE, label="free headroom"),
        *([patch(color=_HOST, label="offloaded")] if offloaded else []),
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.28),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )


def _paged_bar(
    ax: Any,
    y: float,
    agents: tuple[AgentMemory, ...],
    shared_bytes: int,
    base: float,
    card: float,
    gb: float,
) -> None:
    """A paged bar: the shared blocks once, each agent's own blocks, then free headroom."""
    left = base
    shared = _shared(agents, shared_bytes) / gb
    if shared:
        ax.barh(y, shared, left=left, color=_SHARED, edgecolor="white", height=0.6)
        left += shared
    for agent in agents:
        own = (agent.live_bytes - agent.shared_bytes) / gb
        ax.barh(y, own, left=left, color=_LIVE, edgecolor="white", height=0.6)
        left += own
    if left < card:
        ax.barh(y, card - left, left=left, color=_FREE, height=0.6)


def write_record(memory: MemoryMap, path: str | Path) -> Path:
    """Save the map's inputs as JSON, for ``kvgov map --record``."""
    target = Path(path)
    target.write_text(json.dumps(memory.to_json(), indent=2))
    return target
