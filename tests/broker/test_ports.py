"""Ports: a listener left to "any free port" binds one itself (no probe-then-hand-over race
between parallel tests' brokers), below the kernel's ephemeral range so a restart binds it again;
and ``txmsg broker`` whose port is taken, on any of its three listeners, ends with one line that
names the port and the option that changes it (issue 36 item 5: the gRPC port ended in a grpc
traceback and a SIGABRT)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from txmsg_broker import ports
from txmsg_broker.childproc import EXIT_WITH_PARENT_ENV
from txmsg_broker.transport import RemotingServer


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process could hold: a listening socket on it for the test's duration."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


LISTENERS = [
    pytest.param("--namesrv-port", "name server", id="namesrv"),
    pytest.param("--broker-port", "broker", id="broker"),
    pytest.param(
        "--grpc-port",
        "gRPC",
        id="grpc",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("grpc") is None, reason="needs the grpc extra"
        ),
    ),
]


@pytest.mark.parametrize(("option", "listener"), LISTENERS)
def test_txmsg_broker_refuses_a_taken_port_in_one_line(
    tmp_path: Path, held_port: int, option: str, listener: str
) -> None:
    """Started as the fixtures start it (stdin a pipe the parent holds, so the parent-watch
    thread runs: with it a failed start used to abort with SIGABRT), on a port held by a
    listener: exit 1 and one line, no traceback."""
    ports_given = {"--namesrv-port": "0", "--broker-port": "0", option: str(held_port)}
    command = [str(Path(sys.executable).with_name("txmsg")), "broker"]
    for name, value in ports_given.items():
        command += [name, value]
    command += ["--data-dir", str(tmp_path / "data"), "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, EXIT_WITH_PARENT_ENV: "1"},
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        proc.wait(timeout=60)  # stdin stays open meanwhile: its end of file would stop the broker
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines == [
        f"Error: cannot start the broker: the {listener} port 127.0.0.1:{held_port}: address "
        f"already in use. Is another broker using the port? Choose another with {option} "
        "(0 = any free port)."
    ], output
    assert proc.returncode == 1, output


def test_a_restartable_listener_skips_a_taken_port_and_binds_a_free_one(
    held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bind decides: a candidate another process holds is passed over, the next one is
    bound and reported (``port``), no error."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        free = int(probe.getsockname()[1])
    monkeypatch.setattr(ports, "restartable_candidates", lambda: [held_port, free])

    async def bound() -> int:
        server = RemotingServer("broker", "127.0.0.1", 0, restartable=True)
        await server.start()
        try:
            return server.port
        finally:
            await server.stop()

    assert asyncio.run(bound()) == free


def test_restartable_candidates_lie_below_the_ephemeral_range() -> None:
    low = ports.ephemeral_low()
    candidates = ports.restartable_candidates()
    if low <= ports.LOWEST_RESTARTABLE_PORT + 1000:
        assert candidates == []
    else:
        assert candidates
        assert all(ports.LOWEST_RESTARTABLE_PORT <= port < low for port in candidates)
        assert len(set(candidates)) == len(candidates)
