"""The control plane under ``/kvgov/v1``: every call ``LocalBackend`` makes, over HTTP.

Request and response bodies are the models of ``integrations.wire``, which
``RemoteBackend`` sends and reads.
"""

from __future__ import annotations

from fastapi import APIRouter

__all__ = ["router"]

router = APIRouter(prefix="/kvgov/v1")
