"""The API key (SETPO_API_KEY), checked from the headers before anything else of a request is read."""

import secrets

from fastapi import Request

from setpo_server.errors import ApiError
from setpo_server.state import service


async def require_key(request: Request) -> None:
    """Runs before the body is read: a wrong key costs the server a header compare, not a parse."""
    key = service(request).settings.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), key.get_secret_value().encode()):
        message = "missing or wrong API key: send the header 'Authorization: Bearer <SETPO_API_KEY>'"
        raise ApiError(401, message, "authentication_error", unread_body=True)
