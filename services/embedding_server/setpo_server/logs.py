"""The service's log: one format for its own lines and uvicorn's (text, or JSON with SETPO_LOG_FORMAT=json), probes at
DEBUG (a Kubernetes probe every few seconds would drown the rest), no query strings (a key put there must not reach a
log), the caller's name (never its key) where uvicorn writes "-", and no progress bars.
"""

import json
import logging
import os
from contextvars import ContextVar
from typing import Any

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PROBES = frozenset({"/health", "/ready", "/metrics"})
UVICORN_ACCESS = '%s - "%s %s HTTP/%s" %d'  # uvicorn's access line: client, method, path, version, status
# Characters of a path an access line keeps: one caller must not write SETPO_MAX_HEADER_BYTES lines into the log.
MAX_LOGGED_PATH = 200
# The caller a key named (api_keys.py), set by metrics.RequestMetrics just before uvicorn writes the request's line
ACCESS_CALLER: ContextVar[str | None] = ContextVar("setpo_access_caller", default=None)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def access_line(record: logging.LogRecord) -> bool:
    """uvicorn's access record (client, method, path, version, status), its path cut before the query string (and
    after MAX_LOGGED_PATH characters) and the caller's name in place of its "-" (as the common log format's user),
    when a key named one; a probe's line only at DEBUG."""
    if not (isinstance(record.args, tuple) and len(record.args) >= 3 and isinstance(record.args[2], str)):
        return True
    path = record.args[2].split("?", 1)[0]
    if len(path) > MAX_LOGGED_PATH:
        path = f"{path[:MAX_LOGGED_PATH]}...({len(path)} characters)"
    record.args = (*record.args[:2], path, *record.args[3:])
    caller = ACCESS_CALLER.get()
    if caller is not None and record.msg == UVICORN_ACCESS:
        record.msg = '%s %s "%s %s HTTP/%s" %d'
        record.args = (record.args[0], caller, *record.args[1:])
    return path not in PROBES or logging.getLogger("uvicorn.access").isEnabledFor(logging.DEBUG)


def log_config(level: str, fmt: str) -> dict[str, Any]:
    """For uvicorn.Config(log_config=...): the root logger (the service, sentence-transformers) and uvicorn's share
    one handler and one format."""
    formatter = {"()": JsonFormatter} if fmt == "json" else {"format": TEXT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"setpo": formatter},
        "filters": {"access": {"()": lambda: access_line}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "setpo", "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            "uvicorn": {"handlers": [], "level": level.upper(), "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level.upper(), "propagate": True},
            "uvicorn.access": {"handlers": [], "level": level.upper(), "propagate": True, "filters": ["access"]},
        },
    }


def no_progress_bars() -> None:
    """Loading a model draws progress bars (transformers' and the hub's, which read this when imported): a server's
    log is not a terminal. No TQDM_DISABLE: tqdm reads it when imported, and torch has imported it by now."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
