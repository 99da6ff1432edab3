"""Which brokers serve a topic, asked of the name server directly (GET_ROUTEINFO_BY_TOPIC, 105).

Why not through librocketmq: its C API has no route query, and its client factory refreshes routes
only every 30 s.  The announcer needs to know, without sending anything, (1) whether a declared topic
has a route yet - if not, its first send will go through the ``TBW102`` route - and (2) when a
topic's route gains a broker, so the new broker learns the producer group before it checks back.

One short-lived TCP connection per query, the remoting frame of RocketMQ 4.x (JSON header).  The
4.9.8 name server answers old clients with fastjson's non-strict JSON (numeric map keys unquoted,
``{0:"host:port"}``), so keys are quoted before parsing.
"""

from __future__ import annotations

import json
import re
import socket
import struct
from dataclasses import dataclass

GET_ROUTEINFO_BY_TOPIC = 105
SUCCESS = 0
TOPIC_NOT_EXIST = 17
DEFAULT_TOPIC = "TBW102"
_BARE_KEY = re.compile(r"([{,])\s*(-?\d+)\s*:")


@dataclass(frozen=True)
class Route:
    """Master broker addresses of a topic's route (empty when the topic has no route)."""

    topic: str
    masters: frozenset[str]


class RouteQueryError(OSError):
    """The name server could not be asked (unreachable, closed, or answered garbage)."""


def query_route(name_server: str, topic: str, *, timeout: float = 3.0) -> Route:
    """The topic's route from the first name server of ``name_server`` (``host:port[;host:port]``)
    that answers; ``Route(topic, frozenset())`` when it has none (TOPIC_NOT_EXIST)."""
    errors: list[str] = []
    for addr in [a.strip() for a in name_server.split(";") if a.strip()]:
        try:
            code, body = _call(addr, topic, timeout)
        except (OSError, ValueError) as exc:
            errors.append(f"{addr}: {exc}")
            continue
        if code == TOPIC_NOT_EXIST:
            return Route(topic, frozenset())
        if code != SUCCESS:
            errors.append(f"{addr}: code {code}")
            continue
        return Route(topic, _masters(body))
    raise RouteQueryError(
        f"no name server answered the route query for {topic}: {'; '.join(errors)}"
    )


def _masters(body: bytes) -> frozenset[str]:
    data = json.loads(_BARE_KEY.sub(r'\1"\2":', body.decode("utf-8")))
    writable = {
        q.get("brokerName") for q in data.get("queueDatas") or [] if int(q.get("perm", 0)) & 2
    }
    masters = set()
    for broker in data.get("brokerDatas") or []:
        addr = (broker.get("brokerAddrs") or {}).get("0")
        if addr and broker.get("brokerName") in writable:
            masters.add(str(addr))
    return frozenset(masters)


def _call(addr: str, topic: str, timeout: float) -> tuple[int, bytes]:
    host, _, port = addr.rpartition(":")
    header = json.dumps(
        {
            "code": GET_ROUTEINFO_BY_TOPIC,
            "language": "PYTHON",
            "version": 0,
            "opaque": 1,
            "flag": 0,
            "extFields": {"topic": topic},
        },
        separators=(",", ":"),
    ).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(frame)
        (length,) = struct.unpack(">I", _read(sock, 4))
        payload = _read(sock, length)
    (mark,) = struct.unpack(">I", payload[:4])
    header_len = mark & 0xFFFFFF
    response = json.loads(payload[4 : 4 + header_len])
    return int(response.get("code", -1)), payload[4 + header_len :]


def _read(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise RouteQueryError("the name server closed the connection")
        chunks += chunk
    return bytes(chunks)
