"""The API key (api_keys.py), checked from the headers before anything else of a request is read; its caller's name
is kept on the request for admission, the batcher's turns, the metrics and the access log."""

from typing import Annotated

from fastapi import Depends, Request

from setpo_server.api_keys import ANONYMOUS
from setpo_server.errors import ApiError
from setpo_server.state import Service


async def require_key(request: Request, state: Service) -> str:
    """The caller's name (ANONYMOUS when no key is needed). Runs before the body is read: a wrong key costs the server a
    header compare, not a parse."""
    if not state.keys.required:
        return ANONYMOUS
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    name = state.keys.caller(token) if scheme.lower() == "bearer" else None
    if name is None:
        message = "missing or wrong API key: send the header 'Authorization: Bearer <SETPO_API_KEY>'"
        raise ApiError(401, message, "authentication_error", unread_body=True)
    request.state.caller = name  # request.state is the ASGI scope's: metrics.RequestMetrics reads it there
    return name


Caller = Annotated[str, Depends(require_key)]
