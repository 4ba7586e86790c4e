"""``ServeSettings``: how ``kvgov serve`` listens, whom it lets in and what it refuses."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ServeSettings"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    # Bearer keys; empty: no authentication (only sensible on loopback, warned otherwise).
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # never in a log line
    # Of those, the keys that may pin a prefix shared by every tenant (kvgov.serve.control).
    admin_api_keys: tuple[str, ...] = field(default=(), repr=False)
    # The model name clients send and /v1/models lists; None: the backend's own name.
    served_model_name: str | None = None
    max_body_bytes: int = 4 * _MIB  # larger bodies get 413
    max_waiting_requests: int = 256  # more waiting than this gets 429 with Retry-After

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65_535:
            raise ValueError(f"port must be 0 to 65535, got {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        if self.max_waiting_requests < 1:
            raise ValueError(
                f"max_waiting_requests must be at least 1, got {self.max_waiting_requests}"
            )
        if any(not key for key in self.api_keys):
            raise ValueError("an API key must not be empty")
        if not set(self.admin_api_keys) <= set(self.api_keys):
            raise ValueError("every admin API key must also be in api_keys; add it there too")

    @property
    def is_loopback(self) -> bool:
        return self.host in ("127.0.0.1", "::1", "localhost")
