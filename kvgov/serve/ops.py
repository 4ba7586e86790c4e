"""Operations routes: ``GET /health``, ``GET /version`` and ``GET /metrics`` (Prometheus
text, vLLM's names where vLLM has the figure: see ``kvgov.serve.metrics``).

``/health`` is the one route that needs no API key (load balancers and restart probes call
it); it answers 503 with the reason when the engine thread does not answer. ``/metrics``
needs the key when the server has keys (Prometheus sends it with ``authorization``), and
then lists only that key's tenant's budgets.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import Metric

from kvgov.serve.metrics import exposition, families
from kvgov.serve.state import ServerState
from kvgov.serve.tenancy import tenant_of

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


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    # A plain def: Starlette runs it on its thread pool, where waiting for the engine's
    # snapshot (the current step to end) holds no event loop.
    state, tenant = state_of(request), tenant_of(request)

    def read() -> list[Metric]:
        snapshot = state.backend.live_snapshot()
        return families(
            snapshot,
            model_name=state.model_name,
            weights_bytes=state.backend.weights_bytes,
            tenant=tenant,
        )

    return Response(exposition(read), media_type=CONTENT_TYPE_LATEST)
