"""uvicorn's HTTP/1.1 protocol (httptools), bounded before any body exists where uvicorn leaves a connection
open-ended (docs/reliability.md, "What a caller cannot hold"): headers within SETPO_HEADER_TIMEOUT (408) and
SETPO_MAX_HEADER_BYTES (431; a chunked body's trailers count with them), a transfer coding other than chunked 501,
SETPO_MAX_CONNECTIONS (the one idle longest closed, else 503), and an answer not taken within SETPO_WRITE_TIMEOUT
dropped. A refusal is the service's JSON error, then the connection closes lingering. Written against the uvicorn range
setpo-server declares; `check_uvicorn` holds the installed one to it at start.
"""

import asyncio
import socket
import struct
import time
from importlib import metadata
from typing import Any

import httptools
from packaging.requirements import Requirement
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from setpo_server import metrics
from setpo_server.schemas import ErrorDetail, ErrorResponse
from setpo_server.settings import Settings

LINGER_SECONDS = 2.0  # after a refusal: long enough for what the caller had under way


def check_uvicorn() -> str | None:
    """Why the installed uvicorn is not one this protocol was written for, or None when it is."""
    wanted = next(
        req for text in metadata.requires("setpo-server") or [] if (req := Requirement(text)).name == "uvicorn"
    )
    found = metadata.version("uvicorn")
    if found in wanted.specifier:
        return None
    return f"uvicorn {found} is installed; setpo-server's HTTP protocol (protocol.py) needs uvicorn{wanted.specifier}"


class BoundedProtocol(HttpToolsProtocol):
    """One connection, made with the settings' bounds by `setpo-server` (cli.py)."""

    def __init__(self, *args: Any, settings: Settings, max_connections: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout, self.max_header_bytes = settings.header_timeout, settings.max_header_bytes
        self.write_timeout, self.max_connections = settings.write_timeout, max_connections
        self.header_deadline: asyncio.TimerHandle | None = None  # runs until a request's headers are complete
        self.write_deadline: asyncio.TimerHandle | None = None  # runs while the socket takes no more of an answer
        self.in_headers = False  # from a request's first byte until its headers are complete
        self.header_bytes = 0  # of the request whose headers are arriving, or dropped since a refusal
        self.heard_at = time.monotonic()  # when the caller last sent a byte: reclaim_idle closes the oldest first
        self.lingering = False  # refused: what the caller sends from now on is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self.reclaim_idle():
            metrics.CONNECTIONS_REFUSED.inc()
            message = f"the service holds SETPO_MAX_CONNECTIONS={self.max_connections} connections, all busy"
            self.refuse(503, "Service Unavailable", f"{message}; retry shortly", "overloaded", None, retry_after=1)
            return
        metrics.CONNECTIONS_OPEN.set(len(self.connections))
        self.start_header_clock()  # a caller that connects and says nothing

    def busy(self) -> bool:
        """Its headers are arriving, or a request of it is being answered."""
        return self.in_headers or (self.cycle is not None and not self.cycle.response_complete)

    def reclaim_idle(self) -> bool:
        """Close the connection idle longest to make room; False if every one is busy."""
        idle = [c for c in self.connections if c is not self and isinstance(c, BoundedProtocol) and not c.busy()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.heard_at)
        oldest.transport.close()
        self.connections.discard(oldest)  # room now, not when the loop gets round to its connection_lost
        metrics.CONNECTIONS_RECLAIMED.inc()
        return True

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self.header_bytes += len(data)
            if self.header_bytes > self.max_header_bytes:  # not a line under way but a flood: cut it now
                self.transport.close()
            return
        self.heard_at = time.monotonic()
        super().data_received(data)
        if self.in_headers:  # counted after the parse: a read that ends the headers may carry body bytes too
            self.header_bytes += len(data)  # httptools keeps an unfinished header line whole, however long it grows
            if self.header_bytes > self.max_header_bytes and not self.transport.is_closing():
                self.headers_too_large()
        elif self.cycle is not None and self.cycle.response_complete:
            # uvicorn stops its keep-alive timer on any byte: the unread rest of an answered body, trickled, would
            # hold the connection for ever; the header clock does not stop for it
            self.start_header_clock()

    def send_400_response(self, msg: str) -> None:
        if not self.lingering:  # a refusal of ours stopped the parser (on_headers_complete): it is answered already
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_headers, self.header_bytes = True, 0
        self.start_header_clock()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_headers:
            super().on_header(name, value)
            return
        # A trailer, after a chunked body: uvicorn would keep every one, many times its bytes, for as long as the caller
        # sends them. The service reads none: each is counted with the headers and dropped, and a flood cut off.
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > self.max_header_bytes and not self.transport.is_closing():
            metrics.HEADERS_TOO_LARGE.inc()
            self.transport.close()

    def on_headers_complete(self) -> None:
        self.stop_header_clock()
        self.in_headers = False
        # a whole header block can come in one read, never counted in data_received as incomplete: its parsed size
        if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > self.max_header_bytes:
            self.headers_too_large()
            raise httptools.HttpParserCallbackError("refused: 431")  # stops the parse; the rest is dropped
        codings = b", ".join(value for name, value in self.headers if name == b"transfer-encoding").decode("latin-1")
        if codings.replace(" ", "").lower() not in ("", "chunked"):
            message = (
                f"Transfer-Encoding {codings[:100]!r} is not implemented; send the body chunked or with Content-Length"
            )
            self.refuse(501, "Not Implemented", message, "invalid_request_error", "headers")  # RFC 9112 section 6.1
            raise httptools.HttpParserCallbackError("refused: 501")
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_header_clock()
        self.stop_write_clock()
        super().connection_lost(exc)
        metrics.CONNECTIONS_OPEN.set(len(self.connections))

    def pause_writing(self) -> None:
        """The socket takes no more for now: the rest of the answer must go within SETPO_WRITE_TIMEOUT."""
        super().pause_writing()
        if self.write_deadline is None:
            self.write_deadline = self.loop.call_later(self.write_timeout, self.answer_not_taken)
            metrics.ANSWERS_UNSENT.inc()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.stop_write_clock()

    def stop_write_clock(self) -> None:
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None
            metrics.ANSWERS_UNSENT.dec()

    def answer_not_taken(self) -> None:
        """SETPO_WRITE_TIMEOUT ran out: the answer is dropped with its connection; its handler, waiting for the socket,
        then ends and gives back the request's place (admission.limit_in_progress)."""
        metrics.CONNECTIONS_WRITE_TIMED_OUT.inc()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # a reset, not a close: the kernel would otherwise keep the unsent rest for minutes
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()  # drops the unsent answer now (close() would keep it until sent)

    def start_header_clock(self) -> None:
        if self.header_deadline is None:  # the connection's own clock still runs when its first byte arrives
            self.header_deadline = self.loop.call_later(self.header_timeout, self.headers_too_late)

    def stop_header_clock(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def headers_too_late(self) -> None:
        self.header_deadline = None
        if self.transport.is_closing():
            return
        metrics.CONNECTIONS_TIMED_OUT.inc()
        message = f"the request headers did not arrive within SETPO_HEADER_TIMEOUT={self.header_timeout} s"
        self.refuse(408, "Request Timeout", message, "timeout", "headers")

    def headers_too_large(self) -> None:
        metrics.HEADERS_TOO_LARGE.inc()
        message = f"the request headers are larger than SETPO_MAX_HEADER_BYTES={self.max_header_bytes} bytes"
        self.refuse(431, "Request Header Fields Too Large", message, "invalid_request_error", "headers")

    def refuse(
        self, status: int, reason: str, message: str, kind: str, param: str | None, retry_after: int | None = None
    ) -> None:
        """Answer in the service's JSON error shape, then close lingering (closed with the caller's bytes unread, the
        kernel would reset, and the caller could lose the answer). Behind an answer still being sent (pipelined), that
        answer goes out whole, then the close, without this one's."""
        self.lingering, self.in_headers, self.header_bytes, self.heard_at = True, False, 0, 0.0  # reclaimed first
        self.stop_header_clock()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # uvicorn closes the connection once that answer is sent
            return
        body = ErrorResponse(error=ErrorDetail(message=message, type=kind, param=param)).model_dump_json().encode()
        retry = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{retry}connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)
