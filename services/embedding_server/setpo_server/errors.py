"""Every error leaves the service as {"error": {"message", "type", "param"}} with the right status."""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from setpo_server.schemas import ErrorDetail, ErrorResponse

log = logging.getLogger("setpo_server")


class ApiError(Exception):
    """An error meant for the caller: status, a message that says what to do, and the field at fault."""

    def __init__(self, status: int, message: str, type: str, param: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        if status == 401:
            self.headers["WWW-Authenticate"] = "Bearer"


def error_response(error: ApiError) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(message=error.message, type=error.type, param=error.param))
    return JSONResponse(body.model_dump(), status_code=error.status, headers=error.headers)


def field_path(loc: tuple) -> str:
    """('body', 'groups', 2, 'rewards', 1) -> 'groups[2].rewards[1]'."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return error_response(ApiError(400, f"body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}", "invalid_request_error"))
    messages = []
    for err in exc.errors()[:5]:
        msg = err["msg"].removeprefix("Value error, ")
        messages.append(f"{field_path(err['loc'])}: {msg}")
    more = len(exc.errors()) - len(messages)
    message = "; ".join(messages) + (f" (and {more} more errors)" if more > 0 else "")
    return error_response(ApiError(422, message, "invalid_request_error", field_path(first["loc"])))


def body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than SETPO_MAX_BODY_BYTES={limit} bytes; split the request", "invalid_request_error", "body")


class BodyLimit:
    """413 for a body over the limit: at once when Content-Length declares it, else as soon as the streamed
    bytes pass it (raised from receive, so FastAPI hands it to the error handlers)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await error_response(body_too_large(self.max_bytes))(scope, receive, send)
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise HTTPException(413)  # FastAPI lets HTTPException through body parsing; see _http_error
            return message

        await self.app(scope, counted_receive, send)


def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 413:
        return error_response(body_too_large(request.app.state.settings.max_body_bytes))
    kinds = {404: "not_found", 405: "method_not_allowed"}
    return error_response(ApiError(exc.status_code, str(exc.detail), kinds.get(exc.status_code, "invalid_request_error")))


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, f"internal error ({type(exc).__name__}); the service keeps serving", "internal_error"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, lambda request, exc: error_response(exc))
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
