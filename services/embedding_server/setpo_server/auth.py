"""The API key (SETPO_API_KEY, SETPO_API_KEY_FILE: keys.py), checked from the headers before anything else of a
request is read; the key's caller name is kept on the request for the metrics, the access log and the batcher."""

from fastapi import Request

from setpo_server.errors import ApiError
from setpo_server.keys import ANONYMOUS
from setpo_server.state import service


async def require_key(request: Request) -> None:
    """Runs before the body is read: a wrong key costs the server a header compare, not a parse."""
    keys = service(request).keys
    if not keys.required:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    name = keys.caller(token) if scheme.lower() == "bearer" else None
    if name is None:
        message = "missing or wrong API key: send the header 'Authorization: Bearer <SETPO_API_KEY>'"
        raise ApiError(401, message, "authentication_error", unread_body=True)
    request.state.caller = name  # request.state is the ASGI scope's: metrics.RequestMetrics reads it there


def caller(request: Request) -> str:
    """Whose request this is, for the batcher's turns: its key's caller, or ANONYMOUS when no key is needed."""
    return getattr(request.state, "caller", ANONYMOUS)
