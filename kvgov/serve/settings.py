"""``ServeSettings``: how ``kvgov serve`` listens, whom it lets in and what it refuses.

The limits, and why each default:

- Connections (``kvgov.serve.connection``): a request's head (request line and headers)
  is at most ``max_head_bytes`` (431 past it) and must be whole ``head_timeout_s`` after
  the connection opened or its first byte arrived; its body must be whole
  ``body_timeout_s`` after the head (408, or the connection closed); uvicorn answers
  503 once ``max_connections`` connections or requests are open. Together they bound
  what a client without a key can hold: about ``max_connections`` x (``max_head_bytes``
  + 256 KiB, one read) of heads, each for a bounded time.
- Tenants (with API keys; an admin key and a server without keys are not bound): a
  key's own prefix pins hold at most ``tenant_pin_share`` of the pool split evenly
  between the keys that are not admins', so no key's pins can leave another's
  prompts without room; while the waiting queue is full, a key is refused only once
  it has its fair share of the calls in flight (``max_waiting_requests`` split between
  the keys calling at that moment), so one key's flood never locks another out; its
  ``priority`` is lowered to at most ``tenant_max_priority`` and its ``order_age_s``
  to at most ``tenant_max_order_age_s``, so it cannot put its calls ahead of every
  other key's.
- Browsers, without API keys (``kvgov.serve.security``): ``Host`` must name this server
  (a loopback name, ``host``, the address the request came to, or one of
  ``allowed_hosts``), and a cross-site request (``Origin`` or ``Sec-Fetch-Site``) is
  refused: a web page cannot drive the server through DNS rebinding or a form post.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["ServeSettings"]

_KIB = 1024
_MIB = 1024 * _KIB


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    # Bearer keys; empty: no authentication (only sensible on loopback, warned otherwise).
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # never in a log line
    # Of those, the keys that may pin a prefix shared by every tenant (kvgov.serve.control)
    # and that no per-tenant share bounds.
    admin_api_keys: tuple[str, ...] = field(default=(), repr=False)
    # The model name clients send and /v1/models lists; None: the backend's own name.
    served_model_name: str | None = None
    max_body_bytes: int = 4 * _MIB  # larger bodies get 413
    max_waiting_requests: int = 256  # more waiting than this gets 429 with Retry-After
    # Other names a browser-free client may send in Host on a server without API keys
    # (a name this server is reached by, behind a proxy or in /etc/hosts).
    allowed_hosts: tuple[str, ...] = ()
    # 64 KiB: 8 times what nginx lets one header line hold, far above any client's head.
    max_head_bytes: int = 64 * _KIB
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0  # a 4 MiB body at 70 KB/s
    # A swarm keeps one connection per call in flight: 256 waiting and as many running.
    max_connections: int = 1024
    tenant_pin_share: float = 0.5
    tenant_max_priority: int = 0  # the default priority: a key may lower its own, not raise
    tenant_max_order_age_s: float = 60.0

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
        if self.max_head_bytes < 1024:
            raise ValueError(f"max_head_bytes must be at least 1024, got {self.max_head_bytes}")
        for name in ("head_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds above 0, got {value}")
        if not (math.isfinite(self.tenant_max_order_age_s) and self.tenant_max_order_age_s >= 0):
            raise ValueError(
                "tenant_max_order_age_s must be a finite number of seconds, 0 or more, got "
                f"{self.tenant_max_order_age_s}"
            )
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
        if not 0 <= self.tenant_pin_share <= 1:
            raise ValueError(
                "tenant_pin_share is a fraction of the KV pool, 0 to 1, got "
                f"{self.tenant_pin_share}"
            )

    @property
    def is_loopback(self) -> bool:
        return self.host in ("127.0.0.1", "::1", "localhost")

    def tenant_pin_cap(self, num_blocks: int) -> int:
        """The most blocks one bound key's prefix pins may hold in a pool of
        ``num_blocks``: ``tenant_pin_share`` of it, split between the keys that are
        not admins'."""
        num_bound = max(1, len(set(self.api_keys) - set(self.admin_api_keys)))
        return math.floor(num_blocks * self.tenant_pin_share / num_bound)
