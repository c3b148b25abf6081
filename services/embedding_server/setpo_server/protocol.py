"""uvicorn's HTTP/1.1 protocol (httptools) with a deadline for each request's headers: SETPO_HEADER_TIMEOUT.

uvicorn times a body only through the app (SETPO_RECEIVE_TIMEOUT) and idle keep-alive connections only until
their next byte, so a caller that never sends a request line, or trickles header lines (slowloris), would hold
a connection and a file descriptor forever. The clock starts when the connection opens or a request's first
byte arrives, and stops when its headers are complete; on expiry the caller gets 408 and the connection closes.
"""

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from setpo_server.metrics import CONNECTIONS_TIMED_OUT
from setpo_server.schemas import ErrorDetail, ErrorResponse


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0  # setpo-server sets it from the settings (cli.py)
    header_deadline: asyncio.TimerHandle | None = None  # the running clock, per connection once started

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        self.start_header_clock()  # a caller that connects and says nothing

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.start_header_clock()

    def on_headers_complete(self) -> None:
        self.stop_header_clock()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_header_clock()
        super().connection_lost(exc)

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
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request behind a response
            self.cycle.keep_alive = False  # being written: close once it is out, as uvicorn's shutdown does
            return
        CONNECTIONS_TIMED_OUT.inc()
        message = f"the request headers did not arrive within SETPO_HEADER_TIMEOUT={self.header_timeout} s"
        body = (
            ErrorResponse(error=ErrorDetail(message=message, type="timeout", param="headers"))
            .model_dump_json()
            .encode()
        )
        head = (
            f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()
