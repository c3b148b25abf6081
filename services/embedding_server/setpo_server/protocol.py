"""uvicorn's HTTP/1.1 protocol (httptools) with every byte a caller makes the service hold bounded in size and time.

uvicorn bounds none of these itself (docs/reliability.md has each probe and its figures):
- headers: a clock from the connection's or the request's first byte to the end of its headers
  (SETPO_HEADER_TIMEOUT, then 408) and a byte count (SETPO_MAX_HEADER_BYTES, then 431), or a silent caller, a
  slowloris or one endless header would hold a connection, a descriptor and memory;
- leftover bodies: uvicorn cancels its keep-alive timer on *any* byte, so the unread rest of an answered request's
  body, trickled a byte at a time, kept a connection forever; here only a new request does, so a connection whose
  request was answered closes on the keep-alive timer whatever the parser is still waiting for;
- descriptors: at SETPO_MAX_CONNECTIONS (default: the descriptor limit less a reserve) a new connection closes the
  longest-idle one (between requests, or not yet begun), or, when every connection is busy, gets 503 and is closed:
  refused in words, where running out of descriptors would refuse /health in silence;
- answers nobody reads: an answer still unsent SETPO_WRITE_TIMEOUT after the socket stopped taking it is dropped
  with its connection, and the memory it held goes back to the OS;
- refusals (400 for bytes that are not HTTP, 408, 431, 501 for a transfer coding but chunked, 503: each in the
  service's JSON error shape) come after the answers to the requests pipelined before them, and close lingering, as
  nginx's lingering_close: what the caller still sends is read and dropped for up to `linger` seconds and a header's
  worth of bytes, so that its answer is not lost to a reset.
"""

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import httptools
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from setpo_server import metrics
from setpo_server.keys import ANONYMOUS
from setpo_server.runtime import MALLOC_TRIM
from setpo_server.schemas import ErrorDetail, ErrorResponse

if TYPE_CHECKING:
    from setpo_server.state import ServiceState


class BoundedProtocol(HttpToolsProtocol):
    # setpo-server sets these from the settings (cli.py)
    header_timeout: float = 10.0
    max_header_bytes: int = 32 * 1024
    write_timeout: float = 30.0
    max_connections: int = 1024
    linger: float = 2.0  # not a setting: after a refusal, long enough for what the caller had under way
    header_deadline: asyncio.TimerHandle | None = None  # the running header clock, per connection once started
    write_deadline: asyncio.TimerHandle | None = None  # runs while the socket takes no more of an answer
    header_bytes: int = 0  # received since the request began while its headers are incomplete, or since a refusal
    in_headers: bool = True  # from the connection's or a request's first byte until its headers are complete
    in_request: bool = False  # from a request's first byte until its answer is sent
    idle_since: float = 0.0  # monotonic time it last became idle (between requests, or opened)
    lingering: bool = False  # refused: what the caller sends from now on is dropped
    refusal: Callable[[], None] | None = None  # a refusal held until the answers to the requests before it are sent
    service: "ServiceState | None" = None  # setpo-server sets it: answers not taken count as requests in progress
    answering: "RequestResponseCycle | None" = None  # the request whose answer is being written (pipelined: the first)
    unsent_caller: str = ANONYMOUS  # whose answer the socket stopped taking: it holds one of that caller's places

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        self.idle_since = time.monotonic()
        if len(self.connections) > self.max_connections and not self.reclaim_idle():
            metrics.CONNECTIONS_REFUSED.inc()
            message = (
                f"the service holds SETPO_MAX_CONNECTIONS={self.max_connections} connections, all busy; retry shortly"
            )
            self.refuse(503, "Service Unavailable", message, "overloaded", None, retry_after=1)
            return
        metrics.CONNECTIONS_OPEN.set(len(self.connections))
        self.start_header_clock()  # a caller that connects and says nothing

    def reclaim_idle(self) -> bool:
        """Close the connection idle longest (no request under way) to make room; False if every one is busy."""
        idle = [c for c in self.connections if c is not self and isinstance(c, BoundedProtocol) and not c.in_request]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        oldest.transport.close()
        oldest.connections.discard(oldest)  # room now, not when the loop gets round to connection_lost
        metrics.CONNECTIONS_RECLAIMED.inc()
        return True

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self.header_bytes += len(data)
            if self.header_bytes > self.max_header_bytes:  # not a line under way but a flood: cut it now
                self.transport.close()
            return
        # As uvicorn's, but leftover body bytes no longer cancel the keep-alive timer (on_message_begin does), and
        # header bytes are counted: httptools keeps an unfinished header line whole, however long it grows.
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if not self.lingering:  # lingering: a callback refused the request (on_headers_complete) and stopped it
                self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self.in_headers:  # counted after the feed: a chunk that ends the headers may carry body bytes too
            self.header_bytes += len(data)
            if self.header_bytes > self.max_header_bytes and not self.transport.is_closing():
                self.headers_too_large()

    def send_400_response(self, msg: str) -> None:
        """Bytes that are not HTTP (a request line, a header, a body's framing): uvicorn's 400, sent as every other
        answer is, the service's JSON error. A body broken mid-request is answered at once, as uvicorn did, and its
        handler told its caller went: else it would wait for the rest until SETPO_RECEIVE_TIMEOUT, holding its place."""
        message = f"{msg} The request line, a header or the body's framing is not HTTP/1.1."
        cycle = self.cycle
        under_way = cycle is not None and cycle.more_body and not cycle.response_started
        if cycle is not None and under_way:
            cycle.disconnected = True
            cycle.message_event.set()
        self.refuse(400, "Bad Request", message, "invalid_request_error", None, at_once=under_way)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """uvicorn starts a request's app here, when the requests pipelined before it are answered."""
        self.answering = cycle
        super()._start_asgi_task(cycle, app)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._unset_keepalive_if_required()  # a new request: the connection is no longer idle
        self.in_request, self.in_headers, self.header_bytes = True, True, 0
        self.start_header_clock()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_headers:
            super().on_header(name, value)
            return
        # A trailer, after a chunked body: uvicorn would keep every one, ~14x its bytes, for as long as the caller
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
        if codings.replace(" ", "").lower() not in ("", "chunked"):  # httptools would pass the still-coded bytes on
            message = (
                f"Transfer-Encoding {codings[:100]!r} is not implemented; send the body chunked or with Content-Length"
            )
            self.refuse(501, "Not Implemented", message, "invalid_request_error", "headers")  # RFC 9112 section 6.1
            raise httptools.HttpParserCallbackError("refused: 501")
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        if not self.pipeline:
            self.in_request, self.idle_since = False, time.monotonic()
        super().on_response_complete()
        if self.refusal is not None and not self.transport.is_closing():
            self.refusal()  # its turn, unless a pipelined request before it is still being answered

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_header_clock()
        # An answer still unsent (its caller went, or answer_not_taken dropped it): its place is given back and its
        # pages go back to the OS, not to a heap that keeps them.
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None
            self.count_unsent(-1)
            if MALLOC_TRIM is not None:
                MALLOC_TRIM(0)
        super().connection_lost(exc)
        metrics.CONNECTIONS_OPEN.set(len(self.connections))

    def pause_writing(self) -> None:
        """The socket takes no more for now: the rest of the answer must go within SETPO_WRITE_TIMEOUT."""
        super().pause_writing()
        if self.write_deadline is None:
            self.write_deadline = self.loop.call_later(self.write_timeout, self.answer_not_taken)
            self.count_unsent(1)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None
            self.count_unsent(-1)

    def count_unsent(self, change: int) -> None:
        """An answer the socket stopped taking holds its memory until sent or dropped: admission counts it as a
        request in progress, its caller's (auth.require_key put the name in the request's state), so that
        SETPO_MAX_CONCURRENT_REQUESTS bounds what unread answers can pin, and SETPO_MAX_REQUESTS_PER_CALLER what one
        caller's can."""
        if self.service is not None:
            if change > 0 and self.answering is not None:  # not self.cycle: a pipelined request queued behind it
                self.unsent_caller = self.answering.scope.get("state", {}).get("caller", ANONYMOUS)
            self.service.unsent_answers += change
            self.service.hold(self.unsent_caller, change)
            metrics.ANSWERS_UNSENT.set(self.service.unsent_answers)

    def answer_not_taken(self) -> None:
        """SETPO_WRITE_TIMEOUT ran out: the answer is dropped with its connection (connection_lost frees the rest)."""
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
        self,
        status: int,
        reason: str,
        message: str,
        kind: str,
        param: str | None,
        retry_after: int | None = None,
        at_once: bool = False,
    ) -> None:
        """Answer in the service's JSON error shape from the connection itself, after the answers to the requests
        pipelined before this one (HTTP/1.1 answers in order), and close it lingering: closed at once with the
        caller's next bytes unread, the kernel would send a reset, which can cost the caller the answer it has not
        read yet (docs/reliability.md). at_once: the request under way is the one refused, nothing before it to wait
        for."""
        self.lingering, self.header_bytes = True, 0
        self.stop_header_clock()
        if not at_once and self.cycle is not None and not self.cycle.response_complete:
            self.refusal = partial(self.refuse, status, reason, message, kind, param, retry_after)
            return
        self.refusal = None
        body = ErrorResponse(error=ErrorDetail(message=message, type=kind, param=param)).model_dump_json().encode()
        retry = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{retry}connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.write_eof()
        self.in_request, self.idle_since = False, 0.0  # the first connection reclaim_idle closes when room is needed
        self.loop.call_later(self.linger, self.transport.close)
