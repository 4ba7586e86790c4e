"""The live page: ``GET /`` and its two static files, and ``GET /kvgov/v1/live``, the JSON
the page polls about once a second.

The page is plain HTML, CSS and JavaScript from the package (``kvgov/serve/static``), with
no build step and nothing fetched from anywhere but this server; its Content-Security-Policy
says so to the browser too. The page's shell and static files carry no data, so a browser
can load them without a key; every figure comes from ``/kvgov/v1/live``, which needs the
API key when the server has keys (the page asks for it, keeps it in the tab's
``sessionStorage`` and sends it as a Bearer header, never in a URL).
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from kvgov.serve.live import live_view
from kvgov.serve.state import ServerState
from kvgov.serve.tenancy import tenant_of

__all__ = ["CONTENT_SECURITY_POLICY", "PUBLIC_PATHS", "router"]

router = APIRouter()

# Only this server: scripts, styles, the JSON it polls. No inline script, no frames.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_STATIC = {
    "favicon.svg": "image/svg+xml",
    "live.css": "text/css; charset=utf-8",
    "live.js": "text/javascript; charset=utf-8",
}
# The page's shell: no figure in it, and a browser cannot send a Bearer header when it
# navigates, so the auth middleware lets these through; the data route is not among them.
PUBLIC_PATHS = frozenset({"/", *(f"/static/{name}" for name in _STATIC)})
_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return resources.files("kvgov.serve.static").joinpath(name).read_bytes()


@router.get("/", include_in_schema=False)
def page() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/static/{name}", include_in_schema=False)
def static(name: str) -> Response:
    media_type = _STATIC.get(name)
    if media_type is None:  # a fixed list: no path from the URL reaches the file system
        raise HTTPException(status_code=404, detail=f"no static file {name!r}")
    return Response(_read(name), media_type=media_type, headers=_HEADERS)


@router.get("/kvgov/v1/live")
async def live(request: Request) -> dict[str, Any]:
    """The memory map, requests, events and metric samples of one instant, as the
    caller's tenant may see them (``kvgov.serve.live``)."""
    state: ServerState = request.app.state.kvgov
    # Off the event loop: the snapshot waits for the engine's current step to end.
    snapshot = await asyncio.to_thread(state.backend.live_snapshot)
    return live_view(
        snapshot,
        model_name=state.model_name,
        weights_bytes=state.backend.weights_bytes,
        events=state.events,
        instance_id=state.instance_id,
        tenant=tenant_of(request),
    )
