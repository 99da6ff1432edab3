"""A tiny blocking remoting client: admin commands (``txmsg topic create``) and raw-socket tests."""

from __future__ import annotations

import socket
import struct
from typing import Any

from .acl import sign_request
from .codec import RemotingCommand


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the server")
        buf += chunk
    return bytes(buf)


def read_command(sock: socket.socket) -> RemotingCommand:
    (length,) = struct.unpack(">I", recv_exact(sock, 4))
    return RemotingCommand.decode(recv_exact(sock, length))


def connect(addr: str, timeout: float = 5.0) -> socket.socket:
    host, _, port = addr.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def call(
    addr: str,
    code: int,
    ext_fields: dict[str, Any] | None = None,
    body: bytes = b"",
    *,
    timeout: float = 5.0,
    credentials: tuple[str, str] | None = None,
) -> RemotingCommand:
    """Send one request on a fresh connection and return the response; ``credentials``
    (access key, secret key) sign it for a broker with ACL (``acl.sign_request``)."""
    request = RemotingCommand.request(code, ext_fields, body, opaque=1)
    request.language = "PYTHON"
    if credentials is not None:
        sign_request(request, *credentials)
    with connect(addr, timeout) as sock:
        sock.sendall(request.encode())
        while True:
            response = read_command(sock)
            if response.is_response and response.opaque == request.opaque:
                return response
