"""`setpo-server`: run the service with uvicorn. Every setting is a flag (`--help`) and a SETPO_* variable."""

import logging
import logging.config
import os
import resource
import sys
from functools import partial
from typing import cast

import uvicorn
from pydantic import ValidationError

from setpo_server import __version__
from setpo_server.logs import log_config, no_progress_bars
from setpo_server.settings import Settings


def main() -> None:
    from setpo_server.backend import resolve_device
    from setpo_server.runtime import keep_freed_memory, use_threads

    if sys.argv[1:] == ["--version"]:
        print(f"setpo-server {__version__}")
        return
    if any(arg.split("=")[0] == "--api-key" for arg in sys.argv[1:]):
        sys.exit(
            "setpo-server: the API key is read from SETPO_API_KEY only: a command line is visible to every user (ps)"
        )
    try:
        settings = Settings(_cli_parse_args=sys.argv[1:])  # flags over SETPO_* variables; --help prints them all
    except ValidationError as exc:
        problems = "; ".join(f"SETPO_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        sys.exit(f"setpo-server: bad setting: {problems}")
    threads = use_threads(settings.threads)  # before the model and the tokenizer build their pools
    one_heap = keep_freed_memory(resolve_device(settings.device), threads)  # before uvicorn and the model start threads
    no_progress_bars()  # before transformers is imported: it reads the setting then
    logging.config.dictConfig(log_config(settings.log_level, settings.log_format))
    # A misspelt setting would otherwise be ignored without a word. Clients share the prefix (SETPO_URL), so warn.
    unknown = sorted(
        name for name in os.environ if name.startswith("SETPO_") and name[6:].lower() not in Settings.model_fields
    )
    if unknown:
        logging.getLogger("setpo_server").warning("not settings of setpo-server, ignored: %s", ", ".join(unknown))
    logging.getLogger("setpo_server").info(
        "%d threads; glibc heaps: %s", threads, "one for every thread" if one_heap else "glibc's default, one a thread"
    )

    from setpo_server.app import create_app
    from setpo_server.protocol import BoundedProtocol, check_uvicorn
    from setpo_server.state import ServiceState

    if problem := check_uvicorn():
        sys.exit(f"setpo-server: {problem}")
    app = create_app(settings, threads)
    state: ServiceState = app.state.setpo
    # One process: the model lives once in memory, and the batcher sees every request to coalesce them.
    # On SIGTERM uvicorn stops accepting, finishes the requests in flight, then exits.
    connection = partial(BoundedProtocol, settings=settings, max_connections=max_connections(settings.max_connections))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=log_config(settings.log_level, settings.log_format),
        timeout_graceful_shutdown=30,
        http=cast(type[BoundedProtocol], connection),  # uvicorn calls it with its config and state, as a class
    )
    server = uvicorn.Server(config)
    state.shutdown = lambda: setattr(server, "should_exit", True)  # a graceful stop, then the exit code below
    server.run()
    if state.fatal:
        print(f"setpo-server: stopped after a fatal failure: {state.fatal}", file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(1)  # not sys.exit: the interpreter would wait for a hung forward thread forever


def max_connections(setting: int | str) -> int:
    """auto: the descriptor limit less a reserve for the model's files, logs and threads (at least 16)."""
    if setting != "auto":
        return int(setting)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, soft - 64) if soft != resource.RLIM_INFINITY else 65536


if __name__ == "__main__":
    main()
