"""``InstanceHeaderMiddleware``: every answer names the server's instance.

A client that sees the ``x-kvgov-instance`` header change knows the server restarted: its
budgets, pins and holds are gone (``RemoteBackend`` sets them up again). On every route,
errors and refusals included, so a restart is noticed on whichever call comes first.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from integrations.wire import INSTANCE_HEADER

__all__ = ["InstanceHeaderMiddleware"]


class InstanceHeaderMiddleware:
    def __init__(self, app: ASGIApp, *, instance_id: str) -> None:
        self.app = app
        self.instance_id = instance_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[INSTANCE_HEADER] = self.instance_id
            await send(message)

        await self.app(scope, receive, send_with_header)
