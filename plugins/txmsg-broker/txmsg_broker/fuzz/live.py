"""Live-socket fuzz harness: one bad connection per input against a running broker, next to a
well-behaved client whose messages must all be stored and read back intact.

Used by ``txmsg_broker.fuzz.run`` (long mode, ``python -m benchmarks.fuzz_broker``) and ``tests/fuzz/test_live_socket.py`` (in-suite).

Per input: connect, write the input followed by a *probe* (a request with an unknown code, which any
server answers at once with REQUEST_CODE_NOT_SUPPORTED), half-close, read until the broker closes.
The broker must close within the deadline (else: hang), everything it wrote must be whole, valid frames,
no answer may be an "internal error", and when the input was a clean sequence of decodable frames the
probe must be answered (the connection kept serving). The half-close is what lets a truncated frame or
a huge declared length end the exchange instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from txmsg_broker.acl import sign_request
from txmsg_broker.codec import (
    GET_ROUTEINFO_BY_TOPIC,
    PULL_MESSAGE,
    QUERY_CONSUMER_OFFSET,
    REQUEST_CODE_NOT_SUPPORTED,
    SEND_MESSAGE_V2,
    SUCCESS,
    RemotingCommand,
)
from txmsg_broker.message_codec import decode_message
from txmsg_broker.rawclient import connect, read_command

from .inputs import parse_frames, walk_frames

#: (access key, secret key) of a broker with ACL (``run.py --acl``); None = unsigned requests
Credentials = tuple[str, str] | None
PROBE_CODE = 9999
PROBE_OPAQUE = (
    1592597077  # 0x5EED1E55; fuzz inputs draw opaques at random, a clash only weakens a check
)
GOOD_QUEUES = 4


def probe_frame(credentials: Credentials = None) -> bytes:
    """The probe; signed with ``credentials`` for a broker with ACL (which checks unknown codes too)."""
    encoded: bytes = signed(
        RemotingCommand.request(PROBE_CODE, opaque=PROBE_OPAQUE), credentials
    ).encode()
    return encoded


def signed(cmd: RemotingCommand, credentials: Credentials) -> RemotingCommand:
    """``cmd`` signed with (access key, secret key) when given (``run.py --acl``)."""
    return cmd if credentials is None else sign_request(cmd, *credentials)


@dataclass
class Exchange:
    """What happened to one fuzz connection."""

    hung: bool
    answers: list[RemotingCommand]
    leftover: bytes  # bytes the broker wrote that are not whole, valid frames
    seconds: float

    @property
    def probe_answered(self) -> bool:
        return any(
            a.opaque == PROBE_OPAQUE and a.code == REQUEST_CODE_NOT_SUPPORTED and a.is_response
            for a in self.answers
        )


def exchange(
    addr: str, data: bytes, *, deadline: float = 10.0, credentials: Credentials = None
) -> Exchange:
    """Write ``data`` + probe, half-close, read until EOF. Never blocks longer than ``deadline``.
    ``credentials`` sign the probe (a broker with ACL)."""
    started = time.monotonic()
    host, _, port = addr.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=deadline)
    sock.setblocking(False)
    out = memoryview(data + probe_frame(credentials))
    received = bytearray()
    sent = 0
    eof = False
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    try:
        while not eof:
            remaining = started + deadline - time.monotonic()
            if remaining <= 0:
                break
            for _key, events in sel.select(min(remaining, 1.0)):
                if events & selectors.EVENT_READ:
                    try:
                        chunk = sock.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        chunk = None
                    except OSError:  # reset: the broker dropped us, equally fine
                        chunk = b""
                    if chunk == b"":
                        eof = True
                        break
                    if chunk:
                        received += chunk
                if events & selectors.EVENT_WRITE and sent < len(out):
                    try:
                        sent += sock.send(out[sent:])
                    except (BlockingIOError, InterruptedError):
                        pass
                    except (
                        OSError
                    ):  # the broker closed first (bad frame): stop writing, keep reading
                        sent = len(out)
                    if sent >= len(out):
                        with contextlib.suppress(OSError):  # already closed by the broker
                            sock.shutdown(socket.SHUT_WR)
                        sel.modify(sock, selectors.EVENT_READ)
    finally:
        sel.close()
        sock.close()
    answers, leftover = parse_frames(bytes(received))
    return Exchange(
        hung=not eof, answers=answers, leftover=leftover, seconds=time.monotonic() - started
    )


def problems(data: bytes, result: Exchange) -> list[str]:
    """Everything wrong with one exchange (empty list = the broker behaved)."""
    found: list[str] = []
    if result.hung:
        found.append(f"hang: no close within {result.seconds:.1f} s after the client half-closed")
    if result.leftover:
        found.append(
            f"the broker wrote {len(result.leftover)} bytes that are not a whole valid frame"
        )
    found.extend(
        f"undocumented exception in a handler: code {answer.code} {answer.remark!r}"
        for answer in result.answers
        if "internal error" in (answer.remark or "")
    )
    model = walk_frames(data)
    if model.clean_end and not model.uncertain and not result.probe_answered and not result.hung:
        found.append(
            "the connection stopped serving: a clean frame sequence, but the probe got no answer"
        )
    return found


# --- the well-behaved client --------------------------------------------------------------------
class GoodSender(threading.Thread):
    """Sends normal messages over one long-lived connection until stopped; every send must succeed."""

    def __init__(
        self, broker_addr: str, interval: float = 0.005, *, credentials: Credentials = None
    ) -> None:
        super().__init__(name="fuzz-good-sender", daemon=True)
        self.broker_addr = broker_addr
        self.credentials = credentials
        self.interval = interval
        self.topic = f"FuzzGood_{uuid.uuid4().hex[:10]}"
        self.sent: dict[bytes, int] = {}  # body -> queue id, once acknowledged
        self.attempts = 0
        self.failures: list[str] = []
        self.stop_event = threading.Event()

    def send_one(self, sock: socket.socket, i: int) -> None:
        queue_id = i % GOOD_QUEUES
        body = f"good-{i}-{uuid.uuid4().hex}".encode() + bytes(range(i % 64))
        request = RemotingCommand.request(
            SEND_MESSAGE_V2,
            {
                "a": "FuzzGoodPG",
                "b": self.topic,
                "c": "TBW102",
                "d": GOOD_QUEUES,
                "e": queue_id,
                "f": 0,
                "g": int(time.time() * 1000),
                "h": 0,
                "i": f"KEYS\x01k{i}\x02TAGS\x01good\x02",
                "j": 0,
                "k": "false",
                "l": 16,
                "m": "false",
            },
            body,
            opaque=i + 1,
        )
        request.language = "PYTHON"
        sock.sendall(signed(request, self.credentials).encode())
        while True:
            response = read_command(sock)
            if response.is_response and response.opaque == request.opaque:
                break
        if response.code != SUCCESS:
            raise RuntimeError(f"send {i} answered code {response.code}: {response.remark}")
        self.sent[body] = queue_id

    def run(self) -> None:
        i = 0
        try:
            with connect(self.broker_addr, timeout=10.0) as sock:
                while not self.stop_event.is_set():
                    self.attempts += 1
                    self.send_one(sock, i)
                    i += 1
                    self.stop_event.wait(self.interval)
        except Exception as exc:  # noqa: BLE001 - recorded, the caller asserts there are none
            self.failures.append(f"good send {i} failed: {exc!r}")

    def stop(self) -> None:
        self.stop_event.set()
        if self.ident is not None:  # started
            self.join(30)


def read_back(
    broker_addr: str, topic: str, queues: int = GOOD_QUEUES, *, credentials: Credentials = None
) -> dict[bytes, int]:
    """All messages of ``topic`` via PULL from offset 0 (CRC verified): body -> queue id."""
    found: dict[bytes, int] = {}
    with connect(broker_addr, timeout=10.0) as sock:
        opaque = 0
        for queue_id in range(queues):
            offset = 0
            while True:
                opaque += 1
                request = RemotingCommand.request(
                    PULL_MESSAGE,
                    {
                        "consumerGroup": "FuzzReadBack",
                        "topic": topic,
                        "queueId": queue_id,
                        "queueOffset": offset,
                        "maxMsgNums": 32,
                        "sysFlag": 0,
                        "commitOffset": 0,
                        "suspendTimeoutMillis": 0,
                        "subscription": "*",
                        "subVersion": 0,
                    },
                    opaque=opaque,
                )
                sock.sendall(signed(request, credentials).encode())
                response = read_command(sock)
                if response.code != SUCCESS:  # PULL_NOT_FOUND: end of the queue
                    break
                pos = 0
                while pos < len(response.body):
                    msg, pos = decode_message(response.body, pos, verify_crc=True)
                    found[msg.body] = msg.queue_id
                offset = int(response.ext("nextBeginOffset"))
    return found


def healthy(namesrv_addr: str, broker_addr: str, *, credentials: Credentials = None) -> list[str]:
    """Both ports answer a well-formed request on a fresh connection."""
    found: list[str] = []
    for addr, code, ext in (
        (namesrv_addr, GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}),
        (
            broker_addr,
            QUERY_CONSUMER_OFFSET,
            {"consumerGroup": "g", "topic": "TBW102", "queueId": 0},
        ),
    ):
        try:
            with connect(addr, timeout=10.0) as sock:
                sock.sendall(
                    signed(RemotingCommand.request(code, ext, opaque=7), credentials).encode()
                )
                answer = read_command(sock)
            if answer.code != SUCCESS or answer.opaque != 7:
                found.append(f"{addr} answered code {answer.code}: {answer.remark}")
        except OSError as exc:
            found.append(f"{addr} does not answer: {exc!r}")
    return found


#: lines in the broker's logs that mean an exception nobody documented or handled
_LOG_MARKERS = (
    "Traceback",
    "Fatal error",
    "Exception in callback",
    "exception was never retrieved",
)


def _scan(name: str, text: str) -> list[str]:
    found: list[str] = []
    lines = text.splitlines()
    skip_to = 0
    for i, line in enumerate(lines):
        if i >= skip_to and (
            any(marker in line for marker in _LOG_MARKERS)
            or ("handler for code" in line and "failed" in line)
        ):
            context = " | ".join(lines[i : i + 16])
            found.append(f"{name}: {context[:2000]}")
            skip_to = i + 16  # one report per traceback
    return found


def log_findings(log_dir: str | os.PathLike[str]) -> list[str]:
    """Tracebacks and unhandled-exception lines in the broker's console and broker logs."""
    return LogWatcher(log_dir, from_start=True).new_findings()


class LogWatcher:
    """``log_findings`` for what was appended since the last call (pins a finding on one input)."""

    NAMES = ("console.log", "broker.log")

    def __init__(self, log_dir: str | os.PathLike[str], *, from_start: bool = False) -> None:
        self.log_dir = Path(log_dir)
        self.offsets = {name: 0 if from_start else self._size(name) for name in self.NAMES}

    def _size(self, name: str) -> int:
        path = self.log_dir / name
        return path.stat().st_size if path.exists() else 0

    def new_findings(self) -> list[str]:
        found: list[str] = []
        for name in self.NAMES:
            path = self.log_dir / name
            if not path.exists():
                continue
            with open(path, "rb") as fh:
                fh.seek(self.offsets[name])
                data = fh.read()
            self.offsets[name] += len(data)
            found += _scan(name, data.decode(errors="replace"))
        return found
