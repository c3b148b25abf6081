"""The real setpo app with the real embedded model, in the test process: no socket, no server start-up per test.

An event loop in a thread runs the app's lifespan (the model loads and warms as in `setpo-server`); a transport
hands each request to httpx's ASGI transport on that loop, so the real SetpoClient (or httpx, or the openai SDK)
talks to the real app. For HTTP behaviour that needs no real socket (validation, status codes, schema, auth, limits,
metrics); what needs one (timing of bytes, timeouts, hang-ups, signals, start-up failure, uvicorn's own log and
protocol, the CLIs that take a URL) keeps setpo_server.local's LocalServer.

    with InProcessService(max_groups=2) as service:   # settings as keyword arguments, as LocalServer takes them
        client = service.client()                     # SetpoClient; service.http() is an httpx.Client

The settings are the keyword arguments alone, as with LocalServer: the caller's SETPO_* variables do not reach the
service under test. dtype is float32 unless named: the suites compare with float32 references.

The app's Prometheus metrics are process-wide (setpo_server.metrics): every in-process service counts into the
same registry, so a test reads differences across its own requests, as the tests of a shared server do.
No timeout of a client reaches the app here: a test of a timeout or a hang-up needs a real socket.
"""

import asyncio
import threading
from concurrent.futures import Future
from contextlib import AsyncExitStack

import httpx
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from setpo_client import AsyncSetpoClient, SetpoClient
from setpo_server.app import create_app
from setpo_server.settings import Settings
from setpo_server.state import ServiceState


class GivenSettings(Settings):
    """The service's settings from the keyword arguments alone: no SETPO_* variable of the test run's."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


async def answer(asgi: httpx.ASGITransport, request: httpx.Request) -> httpx.Response:
    """One request, its body already read, through the ASGI transport; the answer read whole."""
    request.stream = httpx.ByteStream(request.content)  # the ASGI side reads it asynchronously
    response = await asgi.handle_async_request(request)
    body = await response.aread()
    return httpx.Response(response.status_code, headers=response.headers, content=body, request=request)


class BlockingASGITransport(httpx.BaseTransport):
    """A sync transport over httpx.ASGITransport, running each request on the app's own event loop."""

    def __init__(self, asgi: httpx.ASGITransport, loop: asyncio.AbstractEventLoop):
        self.asgi, self.loop = asgi, loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return asyncio.run_coroutine_threadsafe(answer(self.asgi, request), self.loop).result()


class LoopASGITransport(httpx.AsyncBaseTransport):
    """An async transport for a caller on another event loop (asyncio.run in a test): each request runs on the app's
    own loop, where its batcher and lifespan live, and is awaited from the caller's."""

    def __init__(self, asgi: httpx.ASGITransport, loop: asyncio.AbstractEventLoop):
        self.asgi, self.loop = asgi, loop

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        done: Future[httpx.Response] = asyncio.run_coroutine_threadsafe(answer(self.asgi, request), self.loop)
        return await asyncio.wrap_future(done)


class InProcessService:
    URL = "http://setpo.inprocess"

    def __init__(self, **settings: object):
        settings.setdefault("dtype", "float32")
        self.app = create_app(GivenSettings(**settings))
        self.state: ServiceState = self.app.state.setpo
        self.state.shutdown = lambda: None  # a fatal failure must not SIGTERM the test run
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="setpo-inprocess")
        self.stack = AsyncExitStack()

    def __enter__(self) -> "InProcessService":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=600)  # the model loads and warms
        return self

    async def _start(self) -> None:
        await self.stack.enter_async_context(self.app.router.lifespan_context(self.app))
        while self.state.batcher is None:  # the lifespan loads the model in the background
            if self.state.load_error:
                raise RuntimeError(self.state.load_error)
            await asyncio.sleep(0.05)

    def transport(self) -> BlockingASGITransport:
        return BlockingASGITransport(httpx.ASGITransport(app=self.app), self.loop)

    def async_transport(self) -> LoopASGITransport:
        return LoopASGITransport(httpx.ASGITransport(app=self.app), self.loop)

    def client(self, **kwargs: object) -> SetpoClient:
        return SetpoClient(self.URL, transport=self.transport(), **kwargs)

    def async_client(self, **kwargs: object) -> AsyncSetpoClient:
        return AsyncSetpoClient(self.URL, transport=self.async_transport(), **kwargs)

    def http(self, **kwargs: object) -> httpx.Client:
        """A plain httpx client of the app, for what a test sends raw: httpx.Client(base_url=URL, transport=...)."""
        return httpx.Client(base_url=self.URL, transport=self.transport(), **kwargs)  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.stack.aclose(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
