"""``FakeBackend``: a ``Backend`` for your own tests, with no model but real block accounting.

As httpx ships ``MockTransport``, the governor ships a backend that answers instantly
and deterministically while keeping the engine's rules about memory. The package keeps
one concept per module:

- ``fake_backend``: ``FakeBackend``, the ``Backend`` surface (scripted output, calls
  that wait for blocks, metrics, health and capacity);
- ``fake_pool``: ``FakePool``, the block accounting (pool, budgets, pins, admission,
  offload), guarded by the backend's lock;
- ``fake_waiters``: ``Waiters``, the threads and coroutines waiting for blocks to return;
- ``fake_plan``: ``Plan``, what a call will produce under the engine's finish rules.
"""

from __future__ import annotations

from governor.testing.fake_backend import FakeBackend

__all__ = ["FakeBackend"]
