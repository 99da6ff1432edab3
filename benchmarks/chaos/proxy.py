"""A fault-injecting TCP relay for the chaos run (loopback only): latency, resets, half-open
connections and partitions, per connection or per client process.

Why a relay of our own: the faults must hit the real client (librocketmq) and the real broker
protocol without root (no ``tc netem``, no iptables), and a partition must single out one producer
*process*.  The broker publishes the proxy's address in its routes (``--broker-ip1 127.0.0.2``: the
proxy listens on 127.0.0.2 with the broker's port and relays to 127.0.0.1), so every client's broker
connection runs through it, while the name server is reached directly.  Each accepted connection is
mapped to the client process that owns it (``/proc/net/tcp`` + ``/proc/<pid>/fd``), so faults can
target "all connections of producer-1".

Fault semantics, per direction (``up`` = client -> broker, ``down`` = broker -> client):

* ``latency`` - every chunk is held ``delay`` seconds (a timed queue, so the delay does not add up);
* ``reset`` - both sockets are closed with SO_LINGER 0: an RST, as a crashed middlebox sends;
* ``discard`` - bytes are read and thrown away (a half-open connection: the sender sees no error, a
  one-way END_TRANSACTION is lost); such a stream is broken, so the fault ends with a reset;
* ``pause`` - bytes are not read (TCP back-pressure, as in a partition: the kernel buffers, the peer
  retransmits); ending the pause delivers what waited, like a healed partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

log = logging.getLogger("txmsg.chaos.proxy")

Direction = Literal["up", "down"]
Mode = Literal["pass", "discard", "pause"]
PROXY_IP = "127.0.0.2"
"""The loopback IP the proxy listens on (the broker's ``broker_ip1``)."""


@dataclass
class Link:
    """One relayed connection."""

    id: int
    peer: tuple[str, int]
    listen: tuple[str, int]
    opened: float
    pid: int | None = None
    modes: dict[str, Mode] = field(default_factory=lambda: {"up": "pass", "down": "pass"})
    flowing: dict[str, asyncio.Event] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    discarded: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    closed: bool = False


@dataclass
class ProxyStats:
    accepted: int = 0
    resets: int = 0
    discarded_bytes: int = 0
    upstream_failures: int = 0


class FaultProxy:
    """Relays ``listen -> upstream`` address pairs on its own event loop thread; the fault methods
    are thread-safe (the chaos monkey calls them from its thread)."""

    def __init__(
        self,
        routes: dict[tuple[str, int], tuple[str, int]],
        owners: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        self.routes = dict(routes)
        self.owners = owners
        """Candidate pids for :meth:`pid_of` (the chaos run's client processes)."""
        self.links: dict[int, Link] = {}
        self.stats = ProxyStats()
        self.latency = 0.0
        self._rules: dict[tuple[int | None, str], Mode] = {}  # (pid or None = all, direction)
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: list[asyncio.Server] = []
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except OSError as exc:  # the address is taken: reported to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="chaos-fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise RuntimeError(f"fault proxy could not listen: {failure[0]}") from failure[0]
        return self

    async def _listen(self) -> None:
        for (host, port), upstream in self.routes.items():
            server = await asyncio.start_server(
                functools.partial(self._accept, listen=(host, port), upstream=upstream),
                host,
                port,
                reuse_address=True,
            )
            self._servers.append(server)

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def close() -> None:
            for server in self._servers:
                server.close()
            for link in list(self.links.values()):
                self._reset(link)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def _call(self, fn: Callable[[], object]) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn)

    # -- faults (thread-safe) --------------------------------------------------------------------
    def set_latency(self, seconds: float) -> None:
        """Hold every chunk, both directions, ``seconds`` (0 = none); applies to all links."""
        self.latency = max(0.0, seconds)

    def reset(self, select: Callable[[Link], bool] = lambda link: True) -> int:
        """RST the selected live links now; returns how many."""
        chosen = [link for link in list(self.links.values()) if not link.closed and select(link)]
        for link in chosen:
            self._call(functools.partial(self._reset, link))
        return len(chosen)

    def set_mode(self, pid: int | None, direction: Direction, mode: Mode) -> None:
        """``mode`` for ``direction`` of every link of process ``pid`` (None = every link), now
        and for links that process opens later, until set back to ``pass``."""

        def apply() -> None:
            if mode == "pass":
                self._rules.pop((pid, direction), None)
            else:
                self._rules[(pid, direction)] = mode
            for link in self.links.values():
                if pid is None or link.pid == pid:
                    self._apply(link, direction)

        self._call(apply)

    def links_of(self, pid: int) -> list[Link]:
        return [link for link in list(self.links.values()) if link.pid == pid and not link.closed]

    # -- relay ---------------------------------------------------------------------------------
    def _apply(self, link: Link, direction: str) -> None:
        mode = (
            self._rules.get((link.pid, direction)) or self._rules.get((None, direction)) or "pass"
        )
        link.modes[direction] = mode
        event = link.flowing[direction]
        if mode == "pause":
            event.clear()
        else:
            event.set()

    async def _accept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        listen: tuple[str, int],
        upstream: tuple[str, int],
    ) -> None:
        peer = writer.get_extra_info("peername")
        link = Link(next(self._ids), (peer[0], peer[1]), listen, time.time())
        link.pid = pid_of(peer[1], listen, self.owners())
        link.flowing = {"up": asyncio.Event(), "down": asyncio.Event()}
        link.writers.append(writer)
        self.stats.accepted += 1
        self.links[link.id] = link
        for direction in ("up", "down"):
            self._apply(link, direction)
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:  # broker down (killed by the monkey): the client sees its connection close
            self.stats.upstream_failures += 1
            self._close(link)
            return
        link.writers.append(up_writer)
        await asyncio.gather(
            self._pump(link, "up", reader, up_writer),
            self._pump(link, "down", up_reader, writer),
            return_exceptions=True,
        )
        self._close(link)

    async def _pump(
        self, link: Link, direction: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Read -> (discard | timed queue) -> write; a pause stops reading."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer))
        loop = asyncio.get_running_loop()
        try:
            while not link.closed:
                await link.flowing[direction].wait()
                data = await reader.read(65536)
                if not data:
                    break
                # A pause that began while this read was pending holds the chunk too (else the
                # first chunk of a partition slipped through: seen as a flaky test under load).
                await link.flowing[direction].wait()
                if link.modes[direction] == "discard":
                    link.discarded[direction] += len(data)
                    self.stats.discarded_bytes += len(data)
                    continue
                link.bytes[direction] += len(data)
                queue.put_nowait((loop.time() + self.latency, data))
        finally:
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(Exception):
                await sender
            self._close(link)

    async def _send(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            if not data:
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    def _close(self, link: Link) -> None:
        if link.closed:
            return
        link.closed = True
        for writer in link.writers:
            with contextlib.suppress(Exception):
                writer.close()
        self.links.pop(link.id, None)

    def _reset(self, link: Link) -> None:
        if link.closed:
            return
        self.stats.resets += 1
        for writer in link.writers:
            sock = writer.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(Exception):
                writer.transport.abort()
        link.closed = True
        for event in link.flowing.values():
            event.set()  # wake a paused pump so it sees the link closed
        self.links.pop(link.id, None)


# -- which process owns a connection ---------------------------------------------------------------
def _hex_addr(host: str, port: int) -> str:
    return f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"


def pid_of(peer_port: int, listen: tuple[str, int], candidates: Iterable[int]) -> int | None:
    """The pid among ``candidates`` whose socket is ``127.0.0.1:peer_port -> listen`` (Linux /proc);
    None when not found (another process, or not Linux)."""
    local, remote = _hex_addr("127.0.0.1", peer_port), _hex_addr(*listen)
    inode = None
    try:
        with open("/proc/net/tcp") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 9 and parts[1] == local and parts[2] == remote:
                    inode = parts[9]
                    break
    except OSError:
        return None
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in candidates:
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fd_dir}/{fd}") == target:
                        return pid
        except OSError:
            continue
    return None
