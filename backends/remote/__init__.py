"""``RemoteBackend``: the governor driving the bundled engine behind ``kvgov serve``, and
the wire format both ends import (``backends.remote.wire``)."""

from __future__ import annotations

from backends.remote.backend import RemoteBackend

__all__ = ["RemoteBackend"]
