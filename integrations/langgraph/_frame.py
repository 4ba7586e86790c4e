"""One invocation of a governed LangGraph graph: which lease each node execution runs in.

Private to integrations/. A ``Frame`` is opened per invocation (``invoke``, ``stream``
and their async twins; a governed subgraph gets its own, inside its parent's) and rides
in the run's config under ``FRAME_KEY``, which LangGraph hands to every node and nested
graph. Frames with the same governor share one ``RunScope`` (the token tally and the
tool results already reduced). Which lease a node execution gets (``Frame.plan``):

1. a ``ToolNode`` runs in the lease that asked for its tool calls (the governed node
   whose reply carried them, in this frame); one that ``agents=`` does not name runs
   in the enclosing lease otherwise, or ungoverned when there is none;
2. a node of the same agent as the enclosing lease (the governed node whose subgraph
   this is) runs in that lease;
3. a node reached by ``Send`` gets its own lease for that one execution: a child of its
   sender (the governed node of this frame that ran the step before, preferring the
   planners the topology names), else of the frame's inherited parent, else a plain
   lease. Children share the parent's fan-out cap in every frame, thread and loop,
   since the cap is ``governor.fanout_limiter``'s, keyed by the parent lease;
4. any other node keeps one lease per node for the whole frame, across its supersteps
   (a child of the inherited parent when there is one), released when the frame closes.
   It is parked (reason ``"manual"``) from the end of one of its turns to the start of
   the next: an agent between turns counts against no limit, so a graph whose agents
   take turns cannot deadlock on leases that wait for their next turn.

A node reached by ``Send`` is released when its execution ends, so what it sends in
turn is capped by the inherited parent, not by it: make such a node a governed
subgraph, whose own nodes then keep their leases across its supersteps. With no
governed sender or inherited parent, a ``Send`` is admitted by memory alone.

The inherited parent of a frame is the enclosing lease, else what the enclosing frame
would make the parent of the task that runs this graph. The enclosing lease is the
current lease of the same governor (``integrations._lease_context``): the one a governed
node execution runs in (``GovernedNode`` makes it current while the node runs), or a
``GovernorMiddleware`` run's during its model call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config

from governor import AgentSpec, ChildContext, Governor, Lease, LeaseContext, LeaseState
from integrations._control_flow import failure
from integrations._lease_context import current_lease
from integrations._messages import last_request
from integrations.langgraph._messages import Tally

__all__ = [
    "FRAME_KEY",
    "Frame",
    "Governance",
    "RunScope",
    "Turn",
    "frame_of",
    "open_frame",
]

FRAME_KEY = "__kvgov_graph_frame"  # "__" keeps it out of LangGraph's run metadata
_PUSH = "__pregel_push"  # LangGraph's trigger for a task reached by Send


@dataclass(frozen=True, slots=True)
class Governance:
    """What ``govern`` fixed for one graph."""

    governor: Governor
    agents: Mapping[str, AgentSpec]  # node name -> its agent
    parents: Mapping[str, frozenset[str]]  # worker node -> the planner nodes that send to it
    messages_key: str
    reducer: object  # the messages channel's reducer; None: a node's messages replace it


@dataclass(slots=True, eq=False)
class RunScope:
    """Shared by the frames of one governor in one top-level invocation."""

    governor: Governor
    tally: Tally
    # id(tool message) -> (that message, what it was reduced to): each is reduced once
    reduced: dict[int, tuple[BaseMessage, BaseMessage]] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Held:
    """A lease kept for the whole frame."""

    context: LeaseContext | ChildContext
    entered: bool = False


@dataclass(slots=True, eq=False)
class Turn:
    """The lease of one node execution and what to do around it."""

    lease: Lease
    context: LeaseContext | ChildContext | None = None  # entered and exited around it
    held: _Held | None = None  # a frame lease to enter first, if not yet entered
    resume: bool = False  # bring a parked lease back before the node runs
    push: bool = False  # reached by Send: its input is the Send's, not the state
    between: bool = False  # a frame lease: parked from the end of one turn to the next
    calls_before: int = 0  # lease.num_calls when the node started
    started: float = 0.0  # time.perf_counter() when the node started


def frame_of(config: RunnableConfig | None) -> Frame | None:
    if not config:
        return None
    frame = (config.get("configurable") or {}).get(FRAME_KEY)
    return frame if isinstance(frame, Frame) else None


def open_frame(
    governance: Governance, config: RunnableConfig | None
) -> tuple[Frame, RunnableConfig]:
    """A frame for one invocation, and the config that carries it to the nodes."""
    # A graph invoked inside a node without the node's config still runs in it: LangChain
    # keeps it in a context variable, which LangGraph merges in. So look there too.
    ambient = var_child_runnable_config.get() or {}
    explicit = config or {}
    outer = frame_of(explicit) or frame_of(ambient)
    metadata = explicit.get("metadata") or ambient.get("metadata") or {}
    governor = governance.governor
    if outer is not None and outer.scope.governor is governor:
        scope = outer.scope
    else:
        scope = RunScope(governor, Tally(governor.counter))
    parent = current_lease(governor)
    if parent is None and outer is not None:
        parent = outer.parent_of_task(metadata)
    frame = Frame(governance, scope, parent)
    configurable = {**(explicit.get("configurable") or {}), FRAME_KEY: frame}
    return frame, {**explicit, "configurable": configurable}


class Frame:
    __slots__ = (
        "_failed",
        "_held",
        "_lock",
        "_owners",
        "_questions",
        "_ran",
        "governance",
        "inherited",
        "scope",
    )

    def __init__(self, governance: Governance, scope: RunScope, inherited: Lease | None) -> None:
        self.governance = governance
        self.scope = scope
        self.inherited = inherited
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}  # node name -> its lease for the frame
        self._ran: dict[str, tuple[Lease, int]] = {}  # node -> (its lease, latest step)
        self._owners: dict[str, Lease] = {}  # tool call id -> the lease that asked for it
        # tool call id -> the agent's last request before the call (``last_request``)
        self._questions: dict[str, str | None] = {}
        # lease id -> what the latest turn of a frame lease raised (for its release)
        self._failed: dict[str, BaseException] = {}

    @property
    def governor(self) -> Governor:
        return self.governance.governor

    # -- which lease ----------------------------------------------------------------
    def plan(
        self,
        node: str,
        spec: AgentSpec | None,
        *,
        tool_node: bool,
        config: RunnableConfig,
        calls: list[Mapping[str, Any]] | None,
    ) -> Turn | None:
        """The lease a node execution runs in (module docstring); None: ungoverned.
        ``calls`` are the tool calls a tools node runs."""
        enclosing = current_lease(self.governor)
        metadata = config.get("metadata") or {}
        step = metadata.get("langgraph_step")
        if tool_node:
            owner = self._owner(calls or ()) or (enclosing if spec is None else None)
            if owner is not None:
                return Turn(owner)
        if spec is None:
            return None
        if enclosing is not None and enclosing.agent.name == spec.name:
            self._note(node, enclosing, step)
            return Turn(enclosing, resume=not tool_node)
        if _pushed(metadata):
            parent = self._sender(node, step) or _usable(self.inherited)
            governor = self.governor
            context = governor.child(parent, spec) if parent else governor.lease(spec)
            return Turn(context.lease, context=context, push=True)
        held = self._hold(node, spec)
        self._note(node, held.context.lease, step)
        return Turn(
            held.context.lease,
            held=None if held.entered else held,
            resume=not tool_node,
            between=True,
        )

    def parent_of_task(self, metadata: Mapping[str, Any]) -> Lease | None:
        """The parent this frame gives the task ``metadata`` describes (a nested graph's
        inherited parent)."""
        if _pushed(metadata):
            node, step = str(metadata.get("langgraph_node")), metadata.get("langgraph_step")
            sender = self._sender(node, step)
            if sender is not None:
                return sender
        return _usable(self.inherited)

    def note_calls(
        self, lease: Lease, messages: list[BaseMessage], before: list[BaseMessage] | None
    ) -> None:
        """Remember which lease asked for these tool calls, and the agent's last request
        before each (``before``: the messages the node was given), for the tools node
        after."""
        for i, message in enumerate(messages):
            if isinstance(message, AIMessage) and message.tool_calls:
                question = last_request([*(before or ()), *messages[: i + 1]])
                for call in message.tool_calls:
                    if call.get("id") is not None:
                        self._owners[str(call["id"])] = lease
                        self._questions[str(call["id"])] = question

    def question_for(self, calls: Iterable[Mapping[str, Any]]) -> str | None:
        """The agent's last request before the first of ``calls`` a governed node made."""
        for call in calls:
            question = self._questions.get(str(call.get("id")))
            if question is not None:
                return question
        return None

    def _owner(self, calls: Iterable[Mapping[str, Any]]) -> Lease | None:
        for call in calls:
            owner = self._owners.get(str(call.get("id")))
            if owner is not None and owner.state is not LeaseState.RELEASED:
                return owner
        return None

    def _sender(self, node: str, step: object) -> Lease | None:
        if not isinstance(step, int):
            return None
        wanted = self.governance.parents.get(node)
        with self._lock:
            ran = sorted(self._ran.items())
        for name, (lease, ran_at) in ran:
            if ran_at == step - 1 and (not wanted or name in wanted) and _usable(lease):
                return lease
        return None

    def _note(self, node: str, lease: Lease, step: object) -> None:
        if isinstance(step, int):
            with self._lock:
                self._ran[node] = (lease, step)

    def _hold(self, node: str, spec: AgentSpec) -> _Held:
        with self._lock:
            held = self._held.get(node)
            if held is None:
                parent = _usable(self.inherited)
                governor = self.governor
                context = governor.child(parent, spec) if parent else governor.lease(spec)
                held = self._held[node] = _Held(context)
            return held

    # -- around the node: begin (or abegin) before it, end after it ---------------------
    def ending(self, turn: Turn) -> _Ending:
        """``with`` around a node execution, after ``begin`` or ``abegin``: ``end`` when
        it leaves, told of the error that left it. A plain context manager, so the async
        path needs no coroutine for it."""
        return _Ending(self, turn)

    def begin(self, turn: Turn) -> None:
        """Acquire the turn's lease (blocking this thread while it waits)."""
        if turn.context is not None:
            turn.context.__enter__()
        elif turn.held is not None:
            self._enter_held(turn.held)
        if turn.resume and turn.lease.state is LeaseState.PARKED:
            self.governor.resume(turn.lease)  # ends the idle period its children began
        _started(turn)

    async def abegin(self, turn: Turn) -> None:
        if turn.context is not None:
            await turn.context.__aenter__()
        elif turn.held is not None:
            await self._aenter_held(turn.held)
        if turn.resume and turn.lease.state is LeaseState.PARKED:
            await self.governor.aresume(turn.lease)
        _started(turn)

    def end(self, turn: Turn, error: BaseException | None) -> None:
        """Release a lease taken for this execution only; park a frame lease until the
        node's next turn, so that an idle agent never holds up the ones that run. What
        the node raised goes with the lease's release (a frame lease's, when the frame
        closes, unless a later turn, a retry, ends well)."""
        error = failure(error)
        if turn.context is not None:
            turn.context.__exit__(None if error is None else type(error), error, None)
        elif turn.between:
            if error is not None or self._failed:  # the usual turn ends well: no lock
                with self._lock:
                    if error is None:
                        self._failed.pop(turn.lease.lease_id, None)
                    else:
                        self._failed[turn.lease.lease_id] = error
            self.governor.park(turn.lease, reason="manual")

    def close(self) -> None:
        """Release the frame's leases, the latest first; each one even when releasing
        another fails (the first failure is raised after)."""
        with self._lock:
            held = [h for h in reversed(self._held.values()) if h.entered]
            failed = dict(self._failed)
            self._held.clear()
            self._ran.clear()
            self._owners.clear()
            self._questions.clear()
            self._failed.clear()
        first: BaseException | None = None
        for entry in held:
            error = failed.get(entry.context.lease.lease_id)
            try:
                entry.context.__exit__(None if error is None else type(error), error, None)
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first

    def _enter_held(self, held: _Held) -> None:
        if held.entered:
            return
        try:
            held.context.__enter__()
        except BaseException:
            self._forget(held)
            raise
        held.entered = True

    async def _aenter_held(self, held: _Held) -> None:
        if held.entered:
            return
        try:
            await held.context.__aenter__()
        except BaseException:
            self._forget(held)
            raise
        held.entered = True

    def _forget(self, held: _Held) -> None:
        with self._lock:
            for node, entry in list(self._held.items()):
                if entry is held:
                    del self._held[node]


class _Ending:
    """What ``Frame.ending`` returns."""

    __slots__ = ("frame", "turn")

    def __init__(self, frame: Frame, turn: Turn) -> None:
        self.frame = frame
        self.turn = turn

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.frame.end(self.turn, exc)


def _started(turn: Turn) -> None:
    turn.calls_before = turn.lease.num_calls
    turn.started = time.perf_counter()


def _pushed(metadata: Mapping[str, Any]) -> bool:
    triggers = metadata.get("langgraph_triggers")
    if not triggers:
        return False
    return bool(triggers[0] == _PUSH)


def _usable(lease: Lease | None) -> Lease | None:
    return lease if lease is not None and lease.state is not LeaseState.RELEASED else None
