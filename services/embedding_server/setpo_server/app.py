"""The FastAPI application: loads the model in the background, then serves the routes."""

import asyncio
import logging
import os
import signal
from contextlib import asynccontextmanager

from fastapi import FastAPI

from setpo_server import __version__, metrics
from setpo_server.backend import Backend, resolve_batch_tokens
from setpo_server.batcher import Batcher
from setpo_server.errors import BodyLimit, install_error_handlers
from setpo_server.routes import router
from setpo_server.settings import Settings

log = logging.getLogger("setpo_server")


async def load_model(app: FastAPI) -> None:
    """Load and warm the model off the event loop, so /health answers (and /ready says 503) meanwhile.

    A model that cannot load is fatal: the reason goes to the log and the process stops itself (SIGTERM),
    so an orchestrator sees a crash rather than a pod that is alive but never ready.
    """
    settings: Settings = app.state.settings
    try:
        backend = await asyncio.to_thread(Backend, settings)
        await asyncio.to_thread(backend.warm_up)
    except Exception as exc:
        app.state.load_error = f"{type(exc).__name__}: {exc}"
        log.critical("cannot load model %r: %s", settings.model or "(embedded all-MiniLM-L6-v2)", app.state.load_error)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    max_batch_tokens = resolve_batch_tokens(settings.max_batch_tokens, backend.device, backend.dtype)
    app.state.batcher = Batcher(backend, max_batch_tokens, settings.max_queue_texts)
    metrics.READY.set(1)
    log.info("ready")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loading = asyncio.create_task(load_model(app))
        yield
        loading.cancel()
        if app.state.batcher is not None:
            await app.state.batcher.close()
        metrics.READY.set(0)

    app = FastAPI(
        title="setpo",
        summary="SetPO diversity service: leave-one-out marginals and shaped advantages for groups of responses",
        version=__version__,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.batcher = None
    app.state.load_error = None
    install_error_handlers(app)
    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(metrics.RequestMetrics)  # outermost: times and counts every answer, 413s included
    return app
