"""asyncio TCP server speaking remoting frames, with a per-server dispatch table.

Why per-connection concurrency: librocketmq multiplexes long-polled pulls, sends and heartbeats on one
TCP connection and matches responses by opaque. Handlers registered with ``inline=True`` (cheap ones
such as send) are started straight from ``data_received`` in arrival order - no task, no stream reader,
which matters at thousands of frames per second; if such a handler does suspend, it simply continues as
a task. All other handlers run as their own task, so a held pull never blocks the connection.
Bad frames close only that one connection; a client that stops reading gets its reads paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from . import ports
from .codec import (
    MAX_FRAME_LENGTH,
    REQUEST_CODE_NOT_SUPPORTED,
    SYSTEM_ERROR,
    DecodeError,
    RemotingCommand,
)

log = logging.getLogger("txmsg_broker.transport")

Handler = Callable[[RemotingCommand, "Connection"], Awaitable[RemotingCommand | None]]
_conn_ids = itertools.count(0x1A2B3C4D, 0x1F3)


class Connection:
    """One client TCP connection (a "channel" in Java terms)."""

    def __init__(self, transport: asyncio.Transport, server: RemotingServer) -> None:
        self.transport = transport
        self.server = server
        self.id = next(_conn_ids) & 0xFFFFFFFF
        # a socket already gone has no address: a placeholder for log lines, nothing binds to it
        peer = transport.get_extra_info("peername") or ("0.0.0.0", 0)  # noqa: S104 - placeholder
        local = transport.get_extra_info("sockname") or ("0.0.0.0", 0)  # noqa: S104 - placeholder
        self.remote_addr = f"{peer[0]}:{peer[1]}"
        self.local_addr = f"{local[0]}:{local[1]}"
        self.client_id: str | None = None
        self.language = "UNKNOWN"
        self.version = 0
        self.closed = False
        #: free-form per-connection state for extensions (e.g. the consumer service)
        self.attributes: dict[str, Any] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._opaque = itertools.count(1)
        self.close_callbacks: list[Callable[[Connection], None]] = []

    def __repr__(self) -> str:
        return f"Connection({self.remote_addr}, client_id={self.client_id!r})"

    def describe(self) -> str:
        """Netty's channel toString as the real broker logs it."""
        state = "!" if self.closed else "-"
        return f"[id: 0x{self.id:08x}, L:/{self.local_addr} {state} R:/{self.remote_addr}]"

    def send(self, cmd: RemotingCommand) -> bool:
        """Queue one frame for writing; False if the connection is gone."""
        if self.closed or self.transport.is_closing():
            return False
        try:
            self.transport.write(cmd.encode())
        except (ConnectionError, RuntimeError):
            return False
        return True

    def send_oneway(
        self, code: int, ext_fields: dict[str, Any] | None = None, body: bytes = b""
    ) -> bool:
        """Send a server → client oneway request (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED)."""
        cmd = RemotingCommand.request(
            code, ext_fields, body, opaque=next(self._opaque), oneway=True
        )
        return self.send(cmd)

    async def drain_if_needed(self) -> None:
        """Kept for API compatibility; backpressure is handled by pausing reads."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(RuntimeError):  # the event loop is already closed
            self.transport.close()
        for cb in list(self.close_callbacks):
            try:
                cb(self)
            except Exception:
                log.exception("connection close callback failed")


async def _continue(coro: Coroutine[Any, Any, Any], pending: Any) -> Any:
    """Drive a coroutine that suspended while being run inline, exactly as a Task would."""
    while True:
        try:
            if pending is None:
                await asyncio.sleep(0)
            else:
                # the inner coroutine already flagged the future as awaited; a Task would clear the
                # flag before waiting on it, and so must we (the C Future refuses a second await)
                pending._asyncio_future_blocking = False
                await pending
        except BaseException as exc:  # noqa: BLE001 - delivered into the coroutine
            try:
                pending = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        try:
            pending = coro.send(None)
        except StopIteration as stop:
            return stop.value


class FrameProtocol(asyncio.Protocol):
    """One connection of a :class:`RemotingServer`: splits the byte stream into frames and hands
    each to the server. Public so the fuzz harness (``txmsg_broker.fuzz``) can feed it bytes in
    process, through a stand-in transport, exactly as a socket would."""

    def __init__(self, server: RemotingServer) -> None:
        self.server = server
        self.buf = bytearray()
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):
            raise TypeError(
                f"the remoting protocol needs a stream transport, got {type(transport).__name__}"
            )
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # not a TCP socket, or already gone: nothing to tune
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=8 * 1024 * 1024)
        self.conn = Connection(transport, self.server)
        self.server.connections.add(self.conn)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None or conn.closed:
            return
        buf = self.buf
        buf += data
        server = self.server
        pos = 0
        size = len(buf)
        while size - pos >= 4:
            length = int.from_bytes(buf[pos : pos + 4], "big")
            if length < 4 or length > MAX_FRAME_LENGTH:
                server._report(
                    f"{server.name}: closing {conn.remote_addr}: bad frame: frame length {length} "
                    f"outside 4..{MAX_FRAME_LENGTH}"
                )
                conn.close()
                return
            if size - pos - 4 < length:
                break
            payload = bytes(buf[pos + 4 : pos + 4 + length])
            pos += 4 + length
            try:
                cmd = RemotingCommand.decode(payload)
            except DecodeError as exc:
                server._report(f"{server.name}: closing {conn.remote_addr}: bad frame: {exc}")
                conn.close()
                return
            server._dispatch(cmd, conn)
            if conn.closed:
                return
        if pos:
            del buf[:pos]

    def pause_writing(self) -> None:
        # the client is not reading its responses: stop reading its requests until it catches up
        if self.conn is not None and not self.conn.closed:
            self.conn.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        if conn is None:
            return
        conn.close()
        for task in list(conn.tasks):
            task.cancel()
        self.server.connections.discard(conn)
        for cb in list(self.server.on_connection_closed):
            try:
                cb(conn)
            except Exception:
                log.exception("connection-closed listener failed")


class RemotingServer:
    """A TCP server with a dispatch table ``code -> handler``."""

    def __init__(
        self, name: str, host: str, port: int, *, listener: str = "", restartable: bool = False
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        #: how a refusal names this listener ("name server", "broker"); the name by default
        self.listener = listener or name
        #: port 0 means a free port below the kernel's ephemeral range (``ports.py``: a restart
        #: binds it again), not the kernel's choice
        self.restartable = restartable
        self.handlers: dict[int, tuple[Handler, bool]] = {}
        self.connections: set[Connection] = set()
        self.on_connection_closed: list[Callable[[Connection], None]] = []
        self.on_error: Callable[[str], None] | None = None
        #: checked before every request's handler (the ACL, ``acl.py``): a command returned is the
        #: refusal (sent unless the request is oneway) and the handler never runs
        self.request_hook: (
            Callable[[RemotingCommand, Connection], RemotingCommand | None] | None
        ) = None
        self._server: asyncio.base_events.Server | None = None

    def register(self, code: int, handler: Handler, *, inline: bool = False) -> None:
        self.handlers[code] = (handler, inline)

    async def start(self) -> None:
        """Listen on ``port``; 0 = a free one (``restartable``: tried below the ephemeral range
        first).  A taken port raises :class:`~txmsg_broker.ports.PortInUse`."""
        loop = asyncio.get_running_loop()
        candidates = ports.restartable_candidates() if self.port == 0 and self.restartable else []
        for port in [*candidates, self.port]:
            try:
                self._server = await loop.create_server(
                    lambda: FrameProtocol(self), self.host, port, reuse_address=True, backlog=1024
                )
            except OSError as exc:
                if not ports.in_use(exc):
                    raise
                if port == self.port:  # the port asked for (0 is never in use)
                    raise ports.PortInUse(self.listener, self.host, port) from exc
                continue  # a candidate another process holds: the next one
            break
        assert self._server is not None  # noqa: S101 - the loop binds or raises
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            for task in list(conn.tasks):
                task.cancel()
            conn.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):  # stop anyway; the loop closes what is left
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
        await asyncio.sleep(0)  # let connection_lost callbacks run

    def _report(self, text: str) -> None:
        if self.on_error is not None:
            try:
                self.on_error(text)
            except Exception:
                log.exception("error reporter failed")
        else:
            log.warning("%s", text)

    def _dispatch(self, cmd: RemotingCommand, conn: Connection) -> None:
        if cmd.is_response:
            return  # replies to our oneway requests never come; ignore stray ones
        if conn.language == "UNKNOWN":
            conn.language = cmd.language
            conn.version = cmd.version
        if self.request_hook is not None:
            refusal = self.request_hook(cmd, conn)
            if refusal is not None:
                if not cmd.is_oneway:
                    conn.send(refusal)
                return
        entry = self.handlers.get(cmd.code)
        if entry is None:
            if not cmd.is_oneway:
                conn.send(
                    cmd.error(REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
                )
            return
        handler, inline = entry
        coro = self._run(handler, cmd, conn)
        if inline:
            try:
                pending = coro.send(None)
            except StopIteration:
                return
            task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(
                _continue(coro, pending)
            )
        else:
            task = asyncio.get_running_loop().create_task(coro)
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)

    async def _run(self, handler: Handler, cmd: RemotingCommand, conn: Connection) -> None:
        try:
            response = await handler(cmd, conn)
        except asyncio.CancelledError:
            return
        except (ValueError, KeyError, TypeError) as exc:
            response = cmd.error(SYSTEM_ERROR, f"bad request (code {cmd.code}): {exc}")
        except Exception as exc:  # noqa: BLE001 - one failed request must not stop the server
            self._report(
                f"{self.name}: handler for code {cmd.code} failed: {exc!r}\n{traceback.format_exc()}"
            )
            response = cmd.error(SYSTEM_ERROR, f"internal error handling code {cmd.code}: {exc}")
        if response is not None and not cmd.is_oneway:
            response.opaque = cmd.opaque
            response.flag |= 1
            conn.send(response)
