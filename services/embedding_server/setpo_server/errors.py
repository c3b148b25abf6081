"""Every error leaves the service as {"error": {"message", "type", "param"}} with the right status: the later stages
raise their own errors, never HTTP types; until_done_or_gone maps the batcher's, and the handlers installed here turn
every ApiError, refusal, validation error, HTTP error and crash into that body.
"""

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from setpo_server.batcher import BatcherFailed, Overloaded, TooLarge
from setpo_server.schemas import ErrorDetail, ErrorResponse, Refused

log = logging.getLogger("setpo_server")

LOADING_RETRY_AFTER = 5  # seconds; loading and warming a model takes about this long on CPU
DISCONNECT_POLL_SECONDS = 0.25  # how often a waiting request checks that its caller is still there


class ApiError(Exception):
    """An error meant for the caller: status, a message that says what to do, and the field at fault."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str,
        param: str | None = None,
        retry_after: int | None = None,
        unread_body: bool = False,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        if unread_body:  # answered before the body was read: close, or the server would read and discard it all
            self.headers["Connection"] = "close"
        if status == 401:
            self.headers["WWW-Authenticate"] = "Bearer"


MAX_MESSAGE_CHARS = 1000  # an error names what is wrong, it never hands a caller's body back
# Routes that follow OpenAI's API answer a bad request 400, as OpenAI does; the diversity contract keeps 422.
OPENAI_ROUTES = frozenset({"/v1/embeddings"})


async def until_done_or_gone(request: Request, work: Awaitable[Any], param: str) -> Any:
    """Await `work`, mapping the later stages' refusals to HTTP; a caller that disconnects has it cancelled."""
    task = asyncio.ensure_future(work)
    while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS))[0]:
        if await request.is_disconnected():
            task.cancel()
            raise ApiError(499, "client closed the request; its work was dropped", "client_closed")
    try:
        return task.result()
    except Overloaded as exc:
        raise ApiError(429, str(exc), "overloaded", retry_after=exc.retry_after) from None
    except TooLarge as exc:
        raise ApiError(422, str(exc), "invalid_request_error", param) from None
    except BatcherFailed as exc:
        raise ApiError(
            503, f"the service failed and is restarting: {exc}", "unavailable", retry_after=LOADING_RETRY_AFTER
        ) from None


def error_response(error: ApiError, request: Request | None = None) -> JSONResponse:
    message = error.message if len(error.message) <= MAX_MESSAGE_CHARS else error.message[:MAX_MESSAGE_CHARS] + "..."
    body = ErrorResponse(error=ErrorDetail(message=message, type=error.type, param=error.param))
    openai_route = request is not None and request.url.path in OPENAI_ROUTES
    status = 400 if error.status == 422 and openai_route else error.status
    return JSONResponse(body.model_dump(), status_code=status, headers=error.headers)


def field_path(loc: tuple) -> str:
    """('body', 'groups', 2, 'rewards', 1) -> 'groups[2].rewards[1]'."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        message = f"body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}"
        return error_response(ApiError(400, message, "invalid_request_error"))
    messages = []
    for err in exc.errors()[:5]:
        # routes validate the raw JSON, whose messages say "array" where FastAPI's Python-mode ones said "list"
        msg = err["msg"].removeprefix("Value error, ").replace("a valid array", "a valid list")
        messages.append(f"{field_path(err['loc'])}: {msg}")
    more = len(exc.errors()) - len(messages)
    message = "; ".join(messages) + (f" (and {more} more errors)" if more > 0 else "")
    return error_response(ApiError(422, message, "invalid_request_error", field_path(first["loc"])), request)


def _refused(request: Request, exc: Refused) -> JSONResponse:
    return error_response(ApiError(422, exc.message, "invalid_request_error", exc.param), request)


def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kinds = {404: "not_found", 405: "method_not_allowed"}
    return error_response(
        ApiError(exc.status_code, str(exc.detail), kinds.get(exc.status_code, "invalid_request_error"))
    )


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(
        ApiError(500, f"internal error ({type(exc).__name__}); the service keeps serving", "internal_error")
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, lambda request, exc: error_response(exc, request))
    # Starlette types a handler as taking any Exception; each of these is registered for its own class only
    app.add_exception_handler(Refused, _refused)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
