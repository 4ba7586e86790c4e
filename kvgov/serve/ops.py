"""Operations routes: ``GET /health`` and ``GET /version``.

``/health`` is the one route that needs no API key (load balancers and restart probes call
it); it answers 503 with the reason when the engine thread does not answer.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvgov.serve.state import ServerState

__all__ = ["router"]

router = APIRouter()


def state_of(request: Request) -> ServerState:
    state: ServerState = request.app.state.kvgov
    return state


@router.get("/health")
def health(request: Request) -> JSONResponse:
    state = state_of(request)
    health = state.backend.health()
    body = {"ok": health.ok, "detail": health.detail, "instance_id": state.instance_id}
    return JSONResponse(body, status_code=200 if health.ok else 503)


@router.get("/version")
def version(request: Request) -> dict[str, object]:
    state = state_of(request)
    return {
        "version": state.version,
        "instance_id": state.instance_id,
        "started_at": state.started_at,
        "model": state.model_name,
    }
