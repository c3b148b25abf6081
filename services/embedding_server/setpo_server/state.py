"""The process's state: one typed object, built by create_app and kept as app.state.setpo."""

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request

from setpo_server.batcher import Batcher
from setpo_server.keys import CallerKeys
from setpo_server.settings import Settings


def stop_by_signal() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn stops gracefully on SIGTERM


@dataclass
class ServiceState:
    settings: Settings
    threads: int  # what runtime.use_threads set (reported by /info)
    big_bodies: asyncio.Semaphore  # admission.read_body: big bodies parse a few at a time
    keys: CallerKeys  # the keys accepted now, by caller (auth.require_key); the file's re-read by app's lifespan
    # how the service stops itself after a fatal failure; `setpo-server` sets uvicorn's graceful exit
    shutdown: Callable[[], None] = stop_by_signal
    batcher: Batcher | None = None  # set once the model is loaded and warm (app.load_model)
    load_error: str | None = None  # why the model did not load
    fatal: str | None = None  # why the service stopped itself (app.stop_process); `setpo-server` then exits 1
    in_progress: int = 0  # data requests being served (admission.limit_in_progress)
    # answers whose socket stopped taking them, held until sent or dropped at SETPO_WRITE_TIMEOUT (protocol.py):
    # admission counts them as in progress, or one caller leaving answers unread could pin memory without bound
    unsent_answers: int = 0
    # places held by caller name, requests in progress and answers unsent alike (SETPO_MAX_REQUESTS_PER_CALLER)
    held: dict[str, int] = field(default_factory=dict)

    def hold(self, caller: str, change: int) -> None:
        """A place taken (1) or given back (-1) by `caller`."""
        self.held[caller] = self.held.get(caller, 0) + change
        if not self.held[caller]:
            del self.held[caller]


def service(request: Request) -> ServiceState:
    """The state, for handlers and dependencies. A plain call, not a FastAPI dependency: FastAPI runs a sync
    dependency in a worker thread, and the probes must never wait for one."""
    return request.app.state.setpo
