"""The process's state: one typed object, built by create_app, kept as app.state.setpo and handed to the handlers and
dependencies that need it by `Service`."""

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from setpo_server.api_keys import CallerKeys
from setpo_server.batcher import Batcher
from setpo_server.settings import Settings


@dataclass
class ServiceState:
    settings: Settings
    threads: int  # what runtime.use_threads set (reported by /info)
    big_bodies: asyncio.Semaphore  # admission.read_request: big bodies parse a few at a time
    keys: CallerKeys  # the keys accepted now, by caller (auth.require_key); the file's re-read by app's lifespan
    # how the service stops itself after a fatal failure (uvicorn stops gracefully on SIGTERM); `setpo-server` sets
    # uvicorn's graceful exit
    shutdown: Callable[[], None] = lambda: os.kill(os.getpid(), signal.SIGTERM)
    batcher: Batcher | None = None  # set once the model is loaded and warm (app.load_model)
    load_error: str | None = None  # why the model did not load
    fatal: str | None = None  # why the service stopped itself (app.stop_process); `setpo-server` then exits 1
    in_progress: int = 0  # data requests being served, their answers' sending included (admission)
    held: dict[str, int] = field(default_factory=dict)  # of those, by caller (SETPO_MAX_REQUESTS_PER_CALLER)


async def service(request: Request) -> ServiceState:
    """The state. Async: FastAPI runs a sync dependency in a worker thread, and the probes must never wait for one."""
    return request.app.state.setpo


Service = Annotated[ServiceState, Depends(service)]
