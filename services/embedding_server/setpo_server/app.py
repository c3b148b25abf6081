"""The FastAPI application: loads the model in the background, then serves the routes."""

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from setpo_server import __version__, metrics
from setpo_server.backend import Backend
from setpo_server.batcher import Batcher, resolve_batch_tokens
from setpo_server.errors import install_error_handlers
from setpo_server.routes import BIG_BODIES_AT_ONCE, publish_request_bodies, require_key, router
from setpo_server.settings import Settings

log = logging.getLogger("setpo_server")


def stop_process(app: FastAPI, reason: str) -> None:
    """A fatal failure: /ready says why (503) and uvicorn is told to stop (`setpo-server` sets app.state.shutdown;
    elsewhere SIGTERM); `setpo-server` then exits non-zero, so an orchestrator restarts the service rather than
    probing a hung one."""
    app.state.fatal = reason
    metrics.READY.set(0)
    app.state.shutdown()


async def load_model(app: FastAPI) -> None:
    """Load and warm the model off the event loop, so /health answers (and /ready says 503) meanwhile.
    A model that cannot load is fatal: the reason goes to the log and the process stops."""
    settings: Settings = app.state.settings
    try:
        backend = await asyncio.to_thread(Backend, settings)
        await asyncio.to_thread(backend.warm_up)
    except Exception as exc:
        app.state.load_error = f"{type(exc).__name__}: {exc}"
        log.critical("cannot load model %r: %s", settings.model or "(embedded all-MiniLM-L6-v2)", app.state.load_error)
        stop_process(app, app.state.load_error)
        return
    max_batch_tokens = resolve_batch_tokens(settings.max_batch_tokens, backend.device, backend.dtype)
    app.state.batcher = Batcher(
        backend,
        max_batch_tokens,
        settings.max_queue_texts,
        settings.max_queue_tokens,
        settings.forward_timeout,
        on_failure=lambda reason: stop_process(app, reason),
    )
    metrics.READY.set(1)
    log.info("ready")


def docs_routes(app: FastAPI) -> APIRouter:
    """/openapi.json, /docs and /redoc as FastAPI serves them, behind the key."""
    docs = APIRouter(dependencies=[Depends(require_key)], include_in_schema=False)

    @docs.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @docs.get("/docs")
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="setpo")

    @docs.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="setpo")

    return docs


def create_app(settings: Settings | None = None, threads: int | None = None) -> FastAPI:
    """`threads`: what runtime.use_threads set (reported by /info); by default torch's own count."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(load_model(app))
        yield
        loading.cancel()
        if app.state.batcher is not None:
            await app.state.batcher.close()
        metrics.READY.set(0)

    docs_behind_key = settings.api_key is not None and not settings.public_docs
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
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    app.state.settings = settings
    app.state.threads = threads
    app.state.batcher = None
    app.state.load_error = None
    app.state.fatal = None  # why the service stopped itself (stop_process)
    app.state.shutdown = lambda: os.kill(os.getpid(), signal.SIGTERM)
    app.state.in_progress = 0  # data requests being served (routes.limit_in_progress)
    app.state.big_bodies = asyncio.Semaphore(BIG_BODIES_AT_ONCE)
    install_error_handlers(app)
    app.include_router(router)
    if docs_behind_key:
        app.include_router(docs_routes(app))
    publish_request_bodies(app)
    app.add_middleware(metrics.RequestMetrics)  # times and counts every answer, 401s and 413s included
    return app
