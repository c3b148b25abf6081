"""The FastAPI application: builds the process's state, loads the model in the background, then serves the routes."""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from setpo_server import __version__, metrics
from setpo_server.admission import BIG_BODIES_AT_ONCE
from setpo_server.api_keys import CallerKeys, watch_key_file
from setpo_server.backend import Backend
from setpo_server.batcher import Batcher, resolve_batch_tokens
from setpo_server.errors import install_error_handlers
from setpo_server.openapi import docs_routes, publish_request_bodies
from setpo_server.routes import router
from setpo_server.settings import Settings
from setpo_server.state import ServiceState

log = logging.getLogger("setpo_server")


def stop_process(state: ServiceState, reason: str) -> None:
    """A fatal failure: /ready says why (503), uvicorn is told to stop, and `setpo-server` then exits 1, so that an
    orchestrator restarts the service rather than probing a hung one."""
    state.fatal = reason
    metrics.READY.set(0)
    state.shutdown()


async def load_model(state: ServiceState) -> None:
    """Load and warm the model off the event loop (/health answers meanwhile); a model that cannot load is fatal."""
    settings = state.settings
    try:
        backend = await asyncio.to_thread(Backend, settings)
        await asyncio.to_thread(backend.warm_up)
    except Exception as exc:
        state.load_error = f"{type(exc).__name__}: {exc}"
        log.critical("cannot load model %r: %s", settings.model or "(embedded all-MiniLM-L6-v2)", state.load_error)
        stop_process(state, state.load_error)
        return
    max_batch_tokens = resolve_batch_tokens(settings.max_batch_tokens, backend.device, backend.dtype)
    state.batcher = Batcher(
        backend,
        max_batch_tokens,
        settings.max_queue_texts,
        settings.max_queue_tokens,
        settings.forward_timeout,
        on_failure=lambda reason: stop_process(state, reason),
    )
    metrics.READY.set(1)
    log.info("ready")


def create_app(settings: Settings | None = None, threads: int | None = None) -> FastAPI:
    """`threads`: what runtime.use_threads set (reported by /info); by default torch's own count."""
    settings = settings or Settings()
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    keys = CallerKeys(api_key, settings.api_key_file)
    state = ServiceState(settings, threads, big_bodies=asyncio.Semaphore(BIG_BODIES_AT_ONCE), keys=keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(load_model(state))
        watching = asyncio.create_task(watch_key_file(keys)) if keys.path is not None else None
        yield
        loading.cancel()
        if watching is not None:
            watching.cancel()
        if state.batcher is not None:
            await state.batcher.close()
        metrics.READY.set(0)

    docs_behind_key = keys.required and not settings.public_docs
    app = FastAPI(
        title="setpo",
        summary="SetPO diversity service: leave-one-out marginals and shaped advantages for groups of responses",
        version=__version__,
        lifespan=lifespan,
        # with a key, the API's description is served behind it too (docs_routes), unless SETPO_PUBLIC_DOCS
        openapi_url=None if docs_behind_key else "/openapi.json",
        docs_url=None if docs_behind_key else "/docs",
        redoc_url=None if docs_behind_key else "/redoc",
    )
    app.state.setpo = state  # the one key: handlers read it through state.service(request)
    install_error_handlers(app)
    app.include_router(router)
    if docs_behind_key:
        app.include_router(docs_routes(app))
    publish_request_bodies(app)
    app.add_middleware(metrics.RequestMetrics)  # times and counts every answer, 401s and 413s included
    return app
