"""Requests as the bytes a client writes on a socket, for tests where the bytes and their timing are the point."""


def embeddings_request(key: str, body: bytes) -> bytes:
    """A whole `POST /v1/embeddings` with `body` as it is (JSON the caller built), authorised with `key`."""
    return (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
