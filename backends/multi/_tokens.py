"""``FailoverTokenizer``: ``MultiBackend``'s counting, by any replica in rotation.

Every replica serves the same model, so any one counts exactly; a governor keeps the
``TokenCounter`` it got at start for its whole life, so the counter must not be one
replica's (a ``RemoteBackend`` counts chat messages on its server, which may go away).
Each count asks the first replica in rotation and, where that one is unreachable, takes
it out of rotation and asks the next.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from governor import Backend, BackendUnavailable

__all__ = ["FailoverTokenizer"]

T = TypeVar("T")


class FailoverTokenizer:
    """``encode`` gives as many ids as the replica counts (the counter needs only the
    count); ``count_chat_tokens`` renders with the replica's chat template."""

    def __init__(
        self,
        replicas: Sequence[Backend],
        in_rotation: Callable[[], list[int]],
        down: Callable[[int, BaseException], None],
        name: str,
    ) -> None:
        self._replicas = replicas
        self._in_rotation = in_rotation
        self._down = down
        self.name = name

    def encode(self, text: str) -> list[int]:
        return [0] * self._first(lambda replica: replica.count_tokens(text))

    def count_chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return self._first(lambda replica: replica.count_messages(messages))

    def _first(self, count: Callable[[Backend], T]) -> T:
        error: BaseException | None = None
        for i in self._in_rotation():
            try:
                return count(self._replicas[i])
            except BackendUnavailable as exc:
                self._down(i, exc)
                error = exc
        if error is None:
            error = BackendUnavailable("no replica is in rotation to count with", backend="multi")
        raise error
