"""The chaos run's fault proxy on a loopback echo server: relay, latency, RST, half-open (one
direction discarded), partition (paused, then healed with nothing lost), and the owner pid."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from benchmarks.chaos.faults import FAULTS, schedule
from benchmarks.chaos.proxy import PROXY_IP, FaultProxy


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        # the RST and partition tests reset this side too: an expected end, not an error
        # (socketserver would print "Exception occurred during processing of request" for it)
        with contextlib.suppress(ConnectionError):
            while data := self.request.recv(65536):
                self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    relay = FaultProxy({(PROXY_IP, port): ("127.0.0.1", port)}, owners=lambda: [os.getpid()])
    relay.start()
    relay.port = port  # type: ignore[attr-defined]
    yield relay
    relay.stop()
    server.shutdown()
    server.server_close()


def _connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection((PROXY_IP, proxy.port), timeout=5)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while not proxy.links and time.monotonic() < deadline:
        time.sleep(0.01)
    return sock


def _echo(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_relay_latency_and_owner(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        assert _echo(sock, b"hello") == b"hello"
        (link,) = proxy.links.values()
        assert link.pid == os.getpid()  # found through /proc
        proxy.set_latency(0.2)
        started = time.monotonic()
        assert _echo(sock, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.35  # held 0.2 s each way
        proxy.set_latency(0.0)


def test_reset_sends_rst(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        assert _echo(sock, b"x") == b"x"
        assert proxy.reset() == 1
        with pytest.raises(ConnectionResetError):
            _until_reset(sock)


def _until_reset(sock: socket.socket) -> None:
    for _ in range(50):
        sock.sendall(b"y")
        if not sock.recv(10):
            raise ConnectionResetError("closed")
        time.sleep(0.05)


def test_half_open_loses_one_direction_and_partition_heals(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        assert _echo(sock, b"a") == b"a"
        proxy.set_mode(os.getpid(), "up", "discard")
        time.sleep(0.1)
        sock.sendall(b"lost")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        assert proxy.stats.discarded_bytes == 4
        proxy.set_mode(os.getpid(), "up", "pass")
    with _connect(proxy) as sock:
        proxy.set_mode(None, "up", "pause")
        proxy.set_mode(None, "down", "pause")
        time.sleep(0.1)
        sock.sendall(b"held")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        proxy.set_mode(None, "up", "pass")
        proxy.set_mode(None, "down", "pass")
        sock.settimeout(5)
        assert sock.recv(10) == b"held"  # nothing lost across the healed partition


def test_schedule_covers_every_fault() -> None:
    kinds = schedule(6, random.Random(1))
    assert set(kinds) == set(FAULTS)
    assert len(kinds) == 6
