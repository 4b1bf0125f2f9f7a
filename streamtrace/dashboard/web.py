"""The dashboard's web server: one page, its static assets (uPlot, shipped in the package), a
Server-Sent Events stream of the feed's view and a JSON list of stream names. GET only: the
page can read the engine, never change it.

Bound to loopback by default. Bound anywhere else it needs a token (``?token=`` or
``Authorization: Bearer``), unless ``allow_anonymous`` is set, which is announced loudly.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import math
from importlib import resources

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .access import DashboardError, check_exposure
from .feed import Feed

__all__ = ["make_app", "run"]

MAX_CHOSEN = 12         # charts one page may ask for at once
MAX_POINTS = 1000       # points per chart the server sends at most


class TokenGate:
    """ASGI middleware: every request but the static assets must carry the token."""

    def __init__(self, app, token: str | None):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if self.token and scope["type"] == "http" and not scope["path"].startswith("/static/"):
            if not self._allowed(scope):
                return await PlainTextResponse("a dashboard token is required (?token=...)", 401)(scope, receive, send)
        await self.app(scope, receive, send)

    def _allowed(self, scope) -> bool:
        from urllib.parse import parse_qs
        given = parse_qs(scope.get("query_string", b"").decode()).get("token", [""])[0]
        for k, v in scope.get("headers", []):
            if k == b"authorization" and v.startswith(b"Bearer "):
                given = v[7:].decode(errors="replace")
        return hmac.compare_digest(given.encode(), self.token.encode())


def _clean(obj):
    """JSON for the browser: NaN and infinities (which JSON cannot carry) become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _int(value, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(value), low), high)
    except (TypeError, ValueError):
        return default


def make_app(feed: Feed, *, token: str | None = None, rate_hz: float = 10.0) -> Starlette:
    static = resources.files("streamtrace.dashboard") / "static"
    page = (static / "index.html").read_text()

    async def index(request):
        return HTMLResponse(page)

    async def names(request):
        q = request.query_params
        return JSONResponse(feed.names(q.get("contains", "")[:200], _int(q.get("limit"), 200, 1, 2000)))

    async def events(request):
        q = request.query_params
        chosen = [n for n in q.get("streams", "").split(",") if n][:MAX_CHOSEN]
        points = _int(q.get("points"), 300, 10, MAX_POINTS)
        period = 1.0 / rate_hz

        async def stream():
            yield "retry: 1000\n\n"          # the browser reconnects after a second if cut
            while not await request.is_disconnected():
                body = json.dumps(_clean(feed.view(chosen, points)), separators=(",", ":"))
                yield f"data: {body}\n\n"
                await asyncio.sleep(period)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    routes = [Route("/", index, methods=["GET"]), Route("/api/streams", names, methods=["GET"]),
              Route("/events", events, methods=["GET"]),
              Mount("/static", StaticFiles(directory=str(static)), name="static")]
    return Starlette(routes=routes, middleware=[Middleware(TokenGate, token=token)])


def run(pub: str, host: str = "127.0.0.1", port: int = 8750, *, token: str | None = None,
        allow_anonymous: bool = False, rate_hz: float = 10.0, points: int = 2000, announce=print) -> int:
    """Serve the dashboard until interrupted (blocking)."""
    import uvicorn
    check_exposure(host, token, allow_anonymous, announce)
    feed = Feed(pub, points=points).start()
    config = uvicorn.Config(make_app(feed, token=token, rate_hz=rate_hz), host=host, port=port,
                            log_level="warning", timeout_graceful_shutdown=1, lifespan="off")
    server = uvicorn.Server(config)

    async def main():
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
            url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{bound}/"
            announce(f"streamtrace dashboard: {url}{'?token=<your token>' if token else ''} (engine PUB {pub})")
        await task

    try:
        asyncio.run(main())
    finally:
        feed.close()
    return 0 if server.started else 1
