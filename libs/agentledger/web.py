"""HTTP pieces the services' shells share (ingress, console)."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    """Refuse bodies over ``limit`` bytes (413) before anything parses them."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # chunked bodies declare no length
                    raise HTTPException(413, f"body larger than {self.limit} bytes")
            return message

        await self.app(scope, limited, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Raw ASGI: the answer goes out before any framework has read (or parsed) the body.
        body = json.dumps({"error": {"code": "payload_too_large",
                                     "message": f"body larger than {self.limit} bytes"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
