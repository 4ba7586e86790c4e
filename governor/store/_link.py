"""``StoreLink``: one governor's connection to a Redis store, and the threads beside it.

Every operation runs the store's one script (``_scripts.SCRIPT``) on a single thread, in
the order posted, so a lease's park, hold and re-queue reach the store in the order its
governor made them, and nobody waits on the network while holding a lock or on an event
loop: callers wait on a ``concurrent.futures.Future`` (a thread) or await it wrapped (a
loop). Two more threads: the heartbeat, which keeps this process's deadline ahead of the
store's clock every third of the TTL (and asks after waiting leases, in case a message
was lost while the subscriber reconnected), and the subscriber, which hears this process's
leases admitted by other processes' operations, and every process's expiry.

Operations whose caller needs no answer (release, park, holds, capacity) are kept while
the store is down and sent, in order, before anything else once it answers again;
operations that need one (an admission) fail at once with ``StoreUnavailable``.

Locks: ``_lock`` guards the pending writes and the link's state; nothing is called under
it. The callbacks (``on_reply``, ``on_message``) run on the link's threads, under none.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from governor.errors import StoreUnavailable
from governor.store._scripts import SCRIPT

__all__ = ["Reply", "StoreLink"]

log = logging.getLogger(__name__)

Arg = str | int | float


@dataclass(frozen=True, slots=True)
class Reply:
    """What the script answered: ``status`` (``ok``, ``expired``: this process was
    reaped; ``gone``: the lease was), the store's epoch and whether the caller's was
    another (it restarted empty), the lease ids whose budgets the caller must close, the
    lease ids admitted by this operation, and the operation's own value."""

    status: str
    epoch: str
    restarted: bool
    closing: tuple[str, ...]
    admitted: tuple[str, ...]
    value: Any


class _Op:
    __slots__ = ("args", "future", "keep", "name")

    def __init__(self, name: str, args: Sequence[Arg], keep: bool) -> None:
        self.name = name
        self.args = args
        self.keep = keep  # kept and sent later when the store is down
        self.future: concurrent.futures.Future[Reply | None] = concurrent.futures.Future()


class StoreLink:
    def __init__(
        self,
        client: Any,  # redis.Redis
        *,
        prefix: str,
        proc: str,
        ttl_s: float,
        where: str,
        connection_errors: tuple[type[BaseException], ...],
        on_reply: Callable[[str, Reply], None],
        on_message: Callable[[str, str], None],
        waiting_ids: Callable[[], list[str]],
        after_beat: Callable[[], None] = lambda: None,
    ) -> None:
        self.prefix = prefix
        self.proc = proc
        self.ttl_s = ttl_s
        self.where = where  # the store's address, for errors (no password)
        self.epoch = ""
        self._client = client
        self._script = client.register_script(SCRIPT)  # EVALSHA, EVAL after a restart
        self._down = connection_errors
        self._on_reply = on_reply
        self._on_message = on_message
        self._waiting_ids = waiting_ids
        self._after_beat = after_beat
        self._ops: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._pending: collections.deque[_Op] = collections.deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.last_ok = time.monotonic()  # when the store last answered this process
        self._threads = [
            threading.Thread(target=self._run_ops, name="kvgov-store-ops", daemon=True),
            threading.Thread(target=self._run_heartbeat, name="kvgov-store-beat", daemon=True),
            threading.Thread(target=self._run_messages, name="kvgov-store-sub", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        self._ops.put(None)
        ops, beat, _ = self._threads  # the subscriber sees the stop within its 1 s read
        for thread in (ops, beat):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=5)
        self._client.close()

    @property
    def num_pending(self) -> int:
        """Writes kept while the store was down, not sent yet."""
        with self._lock:
            return len(self._pending)

    # -- posting ------------------------------------------------------------------------
    def post(
        self, name: str, *args: Arg, keep: bool = False
    ) -> concurrent.futures.Future[Reply | None]:
        """Run operation ``name`` on the ops thread; its future holds the reply, or None
        for a ``keep`` operation held back while the store is down, or raises
        ``StoreUnavailable``."""
        op = _Op(name, args, keep)
        if self._stop.is_set():
            closed = StoreUnavailable(self.where, "this governor's link to it is closed")
            op.future.set_exception(closed)
            return op.future
        self._ops.put(op)
        return op.future

    def call(self, name: str, *args: Arg) -> Reply:
        """``post`` and wait for the reply (a thread's call)."""
        reply = self.post(name, *args).result()
        assert reply is not None
        return reply

    # -- the ops thread -----------------------------------------------------------------
    def _run_ops(self) -> None:
        while (op := self._ops.get()) is not None:
            try:
                reply = self._send(op)
            except BaseException as exc:
                if not op.future.cancelled():
                    op.future.set_exception(exc)
            else:
                if not op.future.cancelled():
                    op.future.set_result(reply)

    def _send(self, op: _Op) -> Reply | None:
        """Send what was kept first, in order; then ``op``, or keep it too."""
        try:
            self._flush()
            return self._eval(op.name, op.args)
        except self._down as exc:
            if op.keep:
                with self._lock:
                    self._pending.append(op)
                return None
            raise StoreUnavailable(self.where, _problem(exc)) from exc

    def _flush(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    return
                op = self._pending[0]
            self._eval(op.name, op.args)  # raises while the store is still down
            with self._lock:
                self._pending.popleft()

    def _eval(self, name: str, args: Sequence[Arg]) -> Reply:
        raw = self._script(
            args=[self.prefix, self.proc, self.epoch, round(self.ttl_s * 1000), name, *args]
        )
        status, epoch, restarted, closing, admitted, value = raw
        reply = Reply(
            _text(status),
            _text(epoch),
            bool(restarted),
            tuple(_text(i) for i in closing),
            tuple(_text(i) for i in admitted),
            _value(value),
        )
        answered = time.monotonic()
        first = not self.epoch
        self.epoch = reply.epoch
        if reply.restarted and not first:
            log.warning("the state store %s restarted empty: re-registering", self.where)
        self._on_reply(name, reply)  # may call eval_inline (restore, register)
        # after what it said is applied: a caller that finds the link fresh finds that too
        self.last_ok = answered
        if reply.restarted and not first and reply.status != "ok":
            return self._eval(name, args)  # asked of the emptied store: again, restored
        return reply

    def eval_inline(self, name: str, *args: Arg) -> Reply:
        """Run an operation now, on the ops thread (from ``on_reply``), ahead of the queue."""
        return self._eval(name, args)

    # -- the heartbeat and the subscriber -----------------------------------------------
    def _run_heartbeat(self) -> None:
        interval = self.ttl_s / 3
        while not self._stop.wait(interval):
            future = self.post("heartbeat", *self._waiting_ids(), keep=False)
            try:
                future.result()
                self._after_beat()
            except StoreUnavailable as exc:  # the next beat sends what was kept first
                log.warning("kvgov: %s", exc)
            except Exception:
                log.exception("kvgov: the store heartbeat failed")

    def _run_messages(self) -> None:
        admitted, expired = f"{self.prefix}admitted:{self.proc}", self.prefix + "expired"
        backoff = 0.05
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(admitted, expired)
                backoff = 0.05
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is None or message.get("type") != "message":
                        continue
                    channel = _text(message["channel"])
                    kind = "admitted" if channel == admitted else "expired"
                    self._on_message(kind, _text(message["data"]))
            except self._down:
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
            except Exception:
                log.exception("kvgov: the store subscriber failed")
                self._stop.wait(backoff)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):  # closing a dead connection
                        pubsub.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _value(value: Any) -> Any:
    if isinstance(value, list):
        return [_value(v) for v in value]
    return _text(value) if isinstance(value, bytes) else value


def _problem(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
