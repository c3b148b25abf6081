"""Requests as the bytes a client writes on a socket, for tests where the bytes and their timing are the point."""


def embeddings_request(key: str, body: bytes) -> bytes:
    """A whole `POST /v1/embeddings` with `body` as it is (JSON the caller built), authorised with `key`."""
    return (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def chunked_embeddings_head(key: str) -> bytes:
    """The request line and headers of a `POST /v1/embeddings` whose body comes in chunks; the connection closes after
    the answer."""
    return (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        + f"Authorization: Bearer {key}\r\nConnection: close\r\n\r\n".encode()
    )


def chunked_embeddings_request(key: str, body: bytes, trailers: bytes) -> bytes:
    """embeddings_request's, its body sent as one chunk, then `trailers` (header lines) and the blank line that ends
    them; the connection closes after the answer."""
    return chunked_embeddings_head(key) + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n" + trailers + b"\r\n"
