"""The OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/tokenize`` and ``/detokenize``."""

from __future__ import annotations

from fastapi import APIRouter

__all__ = ["router"]

router = APIRouter()
