"""Ports for the broker's listeners: "any free port" that a restart can bind again, and one
error that names the listener whose port is taken.

Why the broker chooses its own ports: a parent that probes a free port, releases it and then
starts the broker on it races every other process doing the same (pytest-xdist workers starting
brokers at once lost ports that way).  A bind is atomic, so the listener itself tries ports until
one binds and reports the port it got (the ready line).

Why below the kernel's ephemeral range (``restartable``): a test keeps a broker's ports for its
restarts, so connected clients find it again.  A port the kernel hands out for "port 0" comes from
the ephemeral range, where any outgoing connection on the machine can take it while the broker is
down; below that range the kernel hands out nothing by itself.
"""

from __future__ import annotations

import contextlib
import errno
import random
import socket
from pathlib import Path

#: the lowest port chosen for a restartable listener (above the usual fixed service ports)
LOWEST_RESTARTABLE_PORT = 10000
#: at most this many ports are tried before falling back to the kernel's choice
MAX_TRIES = 200


class PortInUse(OSError):
    """A listener could not bind its port because another socket holds it.

    ``listener`` names it as the user knows it ("name server", "broker", "gRPC"), so the refusal
    can say which port is taken and which option changes it."""

    def __init__(self, listener: str, host: str, port: int) -> None:
        super().__init__(errno.EADDRINUSE, "address already in use")
        self.listener = listener
        self.host = host
        self.port = port

    def __str__(self) -> str:
        return (
            f"the {self.listener} port {self.host or '0.0.0.0'}:{self.port}: address already in use"  # noqa: S104 - a message, not a bind
        )


def in_use(exc: BaseException) -> bool:
    """Whether ``exc`` is a bind refused because the address is taken."""
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return low


def restartable_candidates() -> list[int]:
    """Ports below the ephemeral range in random order (at most :data:`MAX_TRIES`); empty when
    that range leaves too little room below it (then the kernel's choice is all there is)."""
    low = ephemeral_low()
    if low <= LOWEST_RESTARTABLE_PORT + 1000:
        return []
    room = range(LOWEST_RESTARTABLE_PORT, low)
    return random.sample(room, min(MAX_TRIES, len(room)))


def can_bind(host: str, port: int) -> bool:
    """Whether ``host:port`` is free for a listener now (bound as listeners bind: SO_REUSEADDR,
    so a port in TIME_WAIT counts as free).  Only a hint, false only for a port surely taken
    (another error, e.g. a host that is not an IPv4 address, is left to the listener's own bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host or "0.0.0.0", port))  # noqa: S104 - what the listener binds
        except OSError as exc:
            return not in_use(exc)
    return True
