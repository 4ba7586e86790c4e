"""What the governor decided, as events: one stream that tracing and tests subscribe to.

Every decision a policy or the admission controller makes about a lease is published as
a ``GovernorEvent`` to the governor's subscribers (``Governor.subscribe``): the
OpenTelemetry instrumentation turns them into span events and metrics, tests and
``kvgov report`` read them back. Kinds, with the attributes each carries:

- ``run.started``: ``name``, ``parent_run_id``; ``run.finished``: ``name``, ``elapsed_s``,
  ``error`` (no lease: ``lease_id`` and ``agent`` are None)
- ``requested``: ``ceiling_tokens``, ``priority``, ``parent_id`` (the parent lease's id),
  ``prefix_blocks`` (its shared prefix's pinned blocks, counted once by admission)
- ``admitted``: ``wait_s`` (seconds waited for admission), ``ceiling_tokens``
- ``parked``: ``reason`` (``"tool"``, ``"children"``, ``"turn"`` (idle between model
  calls), ``"grow"`` or ``"manual"``)
- ``resumed``: ``wait_s``, ``ceiling_tokens``
- ``released``: ``tokens_in_context``, ``num_calls``, ``error`` (what ended the lease's
  block: None, the exception's class name, or ``"cancelled"``)
- ``call.started``: ``max_tokens``
- ``call.finished``: ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
  ``finish_reason``, ``tokens_in_context``, ``blocks_held``, ``elapsed_s``
- ``call.failed``: ``error`` (the exception's class name, ``"cancelled"``, or ``"no result"``
  for a stream that ended without one), ``elapsed_s``
- ``tool.started``: ``tool``
- ``tool.finished``: ``tool``, ``elapsed_s``, ``error`` (None, the exception's class name,
  or ``"cancelled"``)
- ``compacted``: ``record`` is the ``CompactionEvent``
- ``summarized``: ``tool``, ``record`` is the ``ToolOutputReduction``
- ``retained``: ``tokens`` held between calls
- ``offloaded``: ``blocks``, ``reason`` (the pressure policy's, or "by the engine: ...")
- ``dropped``: ``blocks``, ``reason`` (retained KV let go: no host room, its time ran out,
  or the engine ended it for a running request)
- ``restored``: ``blocks``
- ``pressure``: ``blocks_in_use``, ``num_blocks``, ``blocks_needed``

A subscriber runs on the thread that made the decision, never under the admission lock;
keep it quick. One that raises is reported with a warning and never breaks the governor.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from governor.clock import SYSTEM_CLOCK, Clock
from governor.errors import ConfigError

if TYPE_CHECKING:
    from governor.lease import Lease

__all__ = ["EventBus", "GovernorEvent", "LeaseEvents", "error_name"]


@dataclass(frozen=True, slots=True)
class GovernorEvent:
    kind: str
    lease_id: str | None = None
    agent: str | None = None
    tenant: str | None = None
    run_id: str | None = None  # the ``Governor.run`` it happened in
    attributes: Mapping[str, Any] = field(default_factory=dict)
    record: Any = None  # a CompactionEvent or ToolOutputReduction, when there is one
    # Seconds since the epoch: the governor sets its clock's wall(); the default is for
    # events made elsewhere.
    at: float = field(default_factory=SYSTEM_CLOCK.wall)


Subscriber = Callable[[GovernorEvent], None]


class EventBus:
    """Subscribers, called in the order they subscribed."""

    __slots__ = ("_lock", "_subscribers")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: tuple[Subscriber, ...] = ()

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns the function that removes it (idempotent)."""
        if not callable(subscriber):
            raise ConfigError(
                f"a subscriber must be callable with a GovernorEvent, got "
                f"{type(subscriber).__name__}",
                setting="subscriber",
            )
        with self._lock:
            self._subscribers = (*self._subscribers, subscriber)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

        return unsubscribe

    @property
    def active(self) -> bool:
        return bool(self._subscribers)

    def publish(self, event: GovernorEvent) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception as exc:  # a broken exporter must not break the agents
                warnings.warn(
                    f"governor event subscriber {subscriber!r} raised {exc!r}; event "
                    f"{event.kind!r} was not delivered to it",
                    RuntimeWarning,
                    stacklevel=2,
                )


class LeaseEvents:
    """Publishes the events of a lease (or of none: ``pressure``) on a bus, stamped with
    the wall time of the governor's clock; builds nothing while nobody subscribes."""

    __slots__ = ("bus", "clock")

    def __init__(self, bus: EventBus, clock: Clock) -> None:
        self.bus = bus
        self.clock = clock

    @property
    def active(self) -> bool:
        return self.bus.active

    def publish(
        self, kind: str, lease: Lease | None, *, record: object = None, **attributes: object
    ) -> None:
        if not self.bus.active:
            return
        self.bus.publish(
            GovernorEvent(
                kind,
                lease_id=None if lease is None else lease.lease_id,
                agent=None if lease is None else lease.agent.name,
                tenant=None if lease is None else lease.tenant,
                run_id=None if lease is None else lease.run_id,
                attributes=attributes,
                record=record,
                at=self.clock.wall(),
            )
        )


def error_name(error: BaseException | None) -> str | None:
    """How events name what ended a call, tool or lease: None for nothing, ``"cancelled"``
    for a cancelled task or a stream its consumer closed, else the exception's class."""
    if error is None:
        return None
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"
    return type(error).__name__
