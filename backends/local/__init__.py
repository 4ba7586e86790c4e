"""``LocalBackend``: the bundled engine in process. The only package that imports engine/,
and only lazily (inside functions or under ``TYPE_CHECKING``)."""

from __future__ import annotations

from backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
