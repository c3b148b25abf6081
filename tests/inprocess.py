"""The real setpo app with the real embedded model, in the test process: no socket, no server start-up per test.

An event loop in a thread runs the app's lifespan (the model loads and warms as in `setpo-server`); a blocking
httpx transport hands each request to httpx's ASGI transport on that loop, so the real SetpoClient talks to the
real app. For HTTP behaviour that needs no real socket (validation, status codes, schema, limits); what needs one
(timing of bytes, signals, start-up failure) keeps tests.conftest's LocalServer.

    with InProcessService() as service:
        client = service.client()
"""

import asyncio
import threading
from contextlib import AsyncExitStack

import httpx

from setpo_client import SetpoClient
from setpo_server.app import create_app
from setpo_server.settings import Settings
from setpo_server.state import ServiceState


class BlockingASGITransport(httpx.BaseTransport):
    """A sync transport over httpx.ASGITransport, running each request on the app's own event loop."""

    def __init__(self, asgi: httpx.ASGITransport, loop: asyncio.AbstractEventLoop):
        self.asgi, self.loop = asgi, loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> httpx.Response:
            request.stream = httpx.ByteStream(request.read())  # the ASGI side reads it asynchronously
            response = await self.asgi.handle_async_request(request)
            body = await response.aread()
            return httpx.Response(response.status_code, headers=response.headers, content=body, request=request)

        return asyncio.run_coroutine_threadsafe(send(), self.loop).result()


class InProcessService:
    URL = "http://setpo.inprocess"

    def __init__(self, **settings: object):
        self.app = create_app(Settings(**settings))
        self.state: ServiceState = self.app.state.setpo
        self.state.shutdown = lambda: None  # a fatal failure must not SIGTERM the test run
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="setpo-inprocess")
        self.stack = AsyncExitStack()

    def __enter__(self) -> "InProcessService":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=300)
        return self

    async def _start(self) -> None:
        await self.stack.enter_async_context(self.app.router.lifespan_context(self.app))
        while self.state.batcher is None:  # the lifespan loads the model in the background
            if self.state.load_error:
                raise RuntimeError(self.state.load_error)
            await asyncio.sleep(0.05)

    def transport(self) -> BlockingASGITransport:
        return BlockingASGITransport(httpx.ASGITransport(app=self.app), self.loop)

    def client(self, **kwargs: object) -> SetpoClient:
        return SetpoClient(self.URL, transport=self.transport(), **kwargs)  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.stack.aclose(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
