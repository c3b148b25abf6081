"""`setpo-server`: run the service with uvicorn. Every setting is a SETPO_* environment variable."""

import logging
import os
import sys

import uvicorn
from pydantic import ValidationError

from setpo_server.app import create_app
from setpo_server.batcher import keep_freed_memory
from setpo_server.settings import Settings


def main() -> None:
    keep_freed_memory()  # before uvicorn and the model start threads: glibc fixes its heap count at the first one
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(f"SETPO_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        sys.exit(f"setpo-server: bad setting: {problems}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A misspelt setting would otherwise be ignored without a word. Clients share the prefix (SETPO_URL), so warn.
    unknown = sorted(name for name in os.environ if name.startswith("SETPO_") and name[6:].lower() not in Settings.model_fields)
    if unknown:
        logging.getLogger("setpo_server").warning("not settings of setpo-server, ignored: %s", ", ".join(unknown))
    # One process: the model lives once in memory, and the batcher sees every request to coalesce them.
    # On SIGTERM uvicorn stops accepting, finishes the requests in flight, then exits by that signal.
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level, timeout_graceful_shutdown=30)


if __name__ == "__main__":
    main()
