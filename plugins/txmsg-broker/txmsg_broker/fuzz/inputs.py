"""Fuzz inputs for the embedded broker and the in-process checks they are run through.

Why a "chooser": the same generators feed two engines. With atheris every choice is read from the
fuzzer's bytes (``atheris.FuzzedDataProvider``), so libFuzzer's coverage feedback steers the structure
(valid JSON headers, record layouts) and not only raw bytes; without atheris the choices come from a
seeded ``random.Random`` (a mutational fuzzer that starts from the codec's own encodings).

Inputs start from valid encodings produced by the broker's encoders and are then mutated (bit flips,
truncation, splices, length-field edits), or are raw bytes. Targets and their *documented* exceptions:

* ``frame``   - ``RemotingCommand.decode`` (incl. header parsing), typed ext access, re-encode round
  trip: only ``DecodeError`` (``ext_int`` may raise ``ValueError``, as documented);
* ``stream``  - the server's framing loop (``FrameProtocol.data_received``) fed in random chunks, with
  a transport model: a bad frame closes the connection, every good request gets exactly one answer;
* ``message`` - ``decode_messages`` / ``decode_message(verify_crc=True)``: only ``MessageDecodeError``;
* ``batch``   - ``decode_batch``: only ``MessageDecodeError``;
* ``props``   - ``string_to_properties`` on any text, and its round trip: never raises.
* ``acl``     - the ACL check (``txmsg_broker.acl``) on a frame from a fuzzed address: never raises,
  refuses only with SYSTEM_ERROR and an AclException remark; signed with the right secret a request is
  never refused for its signature, and changed after signing it always is (``FUZZ_ACL``). Frames of
  every target carry AccessKey/Signature/SecurityToken/OnsChannel fields, some signed correctly, and
  half of the ``stream`` inputs go through a server with the ACL hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from txmsg_broker.acl import ACL_FIELDS, AccessValidator, sign_request
from txmsg_broker.acl_config import parse_acl
from txmsg_broker.codec import (
    MAX_FRAME_LENGTH,
    SEND_MESSAGE,
    SEND_MESSAGE_V2,
    DecodeError,
    RemotingCommand,
)
from txmsg_broker.message_codec import (
    BatchItem,
    MessageDecodeError,
    StoredMessage,
    decode_batch,
    decode_message,
    decode_messages,
    encode_batch,
    encode_message,
    properties_to_string,
    string_to_properties,
)
from txmsg_broker.transport import Connection, FrameProtocol, RemotingServer

T = TypeVar("T")

# --- interesting values -------------------------------------------------------------------------
INTERESTING_INTS: tuple[int, ...] = (
    0,
    1,
    -1,
    2,
    3,
    4,
    7,
    8,
    16,
    31,
    32,
    127,
    128,
    255,
    256,
    1000,
    0x7FFF,
    0x8000,
    0xFFFF,
    0xFFFFFF,
    0x1000000,
    2**31 - 1,
    2**31,
    -(2**31),
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63,
    -(2**63),
    2**64,
    10**30,
    MAX_FRAME_LENGTH,
    MAX_FRAME_LENGTH + 1,
)
INTERESTING_STRINGS: tuple[str, ...] = (
    "",
    "0",
    "1",
    "-1",
    "--5",
    "-",
    "+5",
    " 7",
    "7 ",
    "1_000",
    "0x1F",
    "\u00b2",
    "\u0663\u0661",
    "1.5",
    "2.0",
    "1e3",
    "1e400",
    "-1e400",
    "inf",
    "-inf",
    "nan",
    "NaN",
    "Infinity",
    "true",
    "false",
    "TRUE",
    "yes",
    "9" * 40,
    "9" * 4400,
    "TBW102",
    "%RETRY%g",
    "%DLQ%g",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "FuzzT",
    "FuzzT_1",
    "T" * 128,
    "T" * 300,
    "bad topic!",
    "\u00e9t\u00e9",
    "\ud800",
    "\udfff",
    "\x00",
    "k\x01v\x02",
    "TRAN_MSG\x01true\x02",
    "UNIQ_KEY\x01u1\x02TAGS\x01t\x02KEYS\x01k\x02",
    "DELAY\x013\x02",
    "\x01\x02\x01",
    "*",
    "a || b",
    "+message.type=TRANSACTION",
    "+message.type=bogus",
    "127.0.0.1:10911",
    "7F0000010000291F0000000000000000",
    "JAVA",
    "CPP",
    "PYTHON",
    "JSON",
    "ROCKETMQ",
    "txmsg-fuzz-admin",
    "ALIYUN",
    "2jmj7l5rSw0yVb/vlWAYkK/YBwk=",
)
EXT_KEYS: tuple[str, ...] = (
    "topic",
    "queueId",
    "queueOffset",
    "maxMsgNums",
    "sysFlag",
    "commitOffset",
    "suspendTimeoutMillis",
    "subscription",
    "subVersion",
    "consumerGroup",
    "producerGroup",
    "defaultTopic",
    "defaultTopicQueueNums",
    "properties",
    "flag",
    "bornTimestamp",
    "reconsumeTimes",
    "unitMode",
    "maxReconsumeTimes",
    "batch",
    "readQueueNums",
    "writeQueueNums",
    "perm",
    "topicSysFlag",
    "order",
    "attributes",
    "group",
    "offset",
    "delayLevel",
    "originMsgId",
    "originTopic",
    "tranStateTableOffset",
    "commitLogOffset",
    "commitOrRollback",
    "fromTransactionCheck",
    "msgId",
    "transactionId",
    "timestamp",
    "clientID",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "i",
    "j",
    "k",
    "l",
    "m",
    "n",
    *ACL_FIELDS,
    "_UNIQUE_KEY_QUERY",
)
#: every code the broker or name server handles, plus neighbours and oddities
CODES: tuple[int, ...] = (
    10,
    11,
    14,
    15,
    17,
    29,
    30,
    31,
    32,
    34,
    35,
    36,
    37,
    38,
    39,
    40,
    41,
    42,
    105,
    106,
    310,
    320,
    0,
    -1,
    9999,
    2**31 - 1,
    103,
    104,
)
FLOATS: tuple[float, ...] = (0.0, -0.0, 1.5, 1e308, -1e308, float("inf"), float("nan"), 2.0**63)
BINARY_LANGUAGES = 12  # RocketMQ's LanguageCode ordinals 0..11


# --- ACL ----------------------------------------------------------------------------------------
FUZZ_ACCESS_KEY = "txmsg-fuzz-admin"
#: (access key, secret key) of the admin account of FUZZ_ACL; the live harness signs with it
FUZZ_CREDENTIALS = (FUZZ_ACCESS_KEY, "fuzz-admin-secret")
FUZZ_LIMITED = ("txmsg-fuzz-limited", "fuzz-limited-secret")
#: the plain_acl.yml of ``run.py --acl`` and of the in-process ``acl``/``stream`` checks
FUZZ_ACL: dict[str, Any] = {
    "globalWhiteRemoteAddresses": ["10.10.103.*", "192.168.0.{1,2,3}"],
    "accounts": [
        {"accessKey": FUZZ_CREDENTIALS[0], "secretKey": FUZZ_CREDENTIALS[1], "admin": True},
        {
            "accessKey": FUZZ_LIMITED[0],
            "secretKey": FUZZ_LIMITED[1],
            "whiteRemoteAddress": "172.16.*.*",
            "defaultTopicPerm": "SUB",
            "defaultGroupPerm": "SUB",
            "topicPerms": ["FuzzT=PUB|SUB", "FuzzT_1=DENY"],
            "groupPerms": ["g=DENY", "FuzzGoodPG=PUB"],
        },
    ],
}
FUZZ_ADDRESSES = (
    "127.0.0.1:40000",
    "10.10.103.9:1",
    "192.168.0.2:2",
    "172.16.5.5:3",
    "[::1]:4",
    "garbage",
    "",
)


# --- choosers -----------------------------------------------------------------------------------
class Chooser(Protocol):
    """Where every random decision comes from."""

    def below(self, n: int) -> int:
        """An int in ``0..n-1`` (``n >= 1``)."""

    def raw(self, max_len: int) -> bytes:
        """Up to ``max_len`` arbitrary bytes."""


class RandomChooser:
    """Choices from a seeded ``random.Random`` (the mutational engine and the live socket phase)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def below(self, n: int) -> int:
        return self.rng.randrange(n) if n > 1 else 0

    def raw(self, max_len: int) -> bytes:
        # short inputs are the interesting ones most of the time
        limit = max_len if self.rng.randrange(8) == 0 else min(max_len, 64)
        return self.rng.randbytes(self.rng.randrange(limit + 1))


class FdpChooser:
    """Choices read from the fuzzer's input (``atheris.FuzzedDataProvider``)."""

    def __init__(self, fdp: Any) -> None:
        self.fdp = fdp

    def below(self, n: int) -> int:
        return int(self.fdp.ConsumeIntInRange(0, n - 1)) if n > 1 else 0

    def raw(self, max_len: int) -> bytes:
        return bytes(self.fdp.ConsumeBytes(int(self.fdp.ConsumeIntInRange(0, max_len))))


def pick(ch: Chooser, seq: Sequence[T]) -> T:
    return seq[ch.below(len(seq))]


def chance(ch: Chooser, one_in: int) -> bool:
    return ch.below(one_in) == 0


def any_int(ch: Chooser) -> int:
    kind = ch.below(4)
    if kind == 0:
        return pick(ch, INTERESTING_INTS)
    if kind == 1:
        return pick(ch, INTERESTING_INTS) + ch.below(5) - 2
    if kind == 2:
        return ch.below(64)
    return int.from_bytes(ch.raw(9), "big", signed=True) if chance(ch, 2) else ch.below(2**31)


def any_text(ch: Chooser, max_len: int = 40) -> str:
    kind = ch.below(3)
    if kind == 0:
        return pick(ch, INTERESTING_STRINGS)
    if kind == 1:
        return ch.raw(max_len).decode("latin-1")
    return ch.raw(max_len).decode("utf-8", "replace")


def topic_name(ch: Chooser) -> str:
    """Topic names for fuzz traffic. Never ``FuzzGood*``: that prefix belongs to the well-behaved client."""
    kind = ch.below(4)
    if kind == 0:
        return pick(ch, ("FuzzT", "FuzzT_1", "TBW102", "%RETRY%g", "RMQ_SYS_TRANS_HALF_TOPIC", "X"))
    if kind == 1:
        return any_text(ch, 20)
    return "Fz" + ch.raw(12).hex()[: 2 + ch.below(20)]


# --- JSON headers -------------------------------------------------------------------------------
_DEEP = "\u0000DEEP\u0000"  # placeholder replaced by a deeply nested literal after json.dumps
_DEEP_JSON = json.dumps(_DEEP)


def json_value(ch: Chooser, depth: int = 0) -> Any:
    kind = ch.below(11 if depth < 3 else 6)
    if kind == 0:
        return any_int(ch)
    if kind == 1:
        return any_text(ch)
    if kind == 2:
        return pick(ch, FLOATS)
    if kind == 3:
        return bool(ch.below(2))
    if kind == 4:
        return None
    if kind == 5:
        return pick(ch, INTERESTING_STRINGS)
    if kind in (6, 7):
        return [json_value(ch, depth + 1) for _ in range(ch.below(4))]
    if kind in (8, 9):
        return {any_text(ch, 8): json_value(ch, depth + 1) for _ in range(ch.below(4))}
    return _DEEP


def ext_fields(ch: Chooser) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for _ in range(ch.below(9)):
        key = pick(ch, EXT_KEYS) if ch.below(4) else any_text(ch, 12)
        if key in ("topic", "b", "c", "defaultTopic", "originTopic") and ch.below(3):
            fields[key] = topic_name(ch)
        elif ch.below(3):
            fields[key] = str(any_int(ch)) if ch.below(2) else pick(ch, INTERESTING_STRINGS)
        else:
            fields[key] = json_value(ch)
    return fields


def header_dict(ch: Chooser) -> dict[str, Any]:
    """A header that is usually well-formed, with each field sometimes missing or of a wrong type."""

    def field(valid: Callable[[], Any]) -> Any:
        roll = ch.below(10)
        if roll < 7:
            return valid()
        if roll < 9:
            return json_value(ch)
        return _MISSING

    header: dict[str, Any] = {
        "code": field(lambda: pick(ch, CODES) if ch.below(4) else any_int(ch)),
        "opaque": field(lambda: ch.below(2**31)),
        "flag": field(lambda: pick(ch, (0, 0, 0, 1, 2, 3))),
        "language": field(lambda: pick(ch, ("JAVA", "CPP", "PYTHON", "GO", ""))),
        "version": field(lambda: pick(ch, (0, 317, 333, 396, -1))),
        "remark": field(lambda: any_text(ch) if ch.below(2) else None),
        "extFields": field(lambda: ext_fields(ch)),
        "serializeTypeCurrentRPC": field(lambda: "JSON"),
    }
    for _ in range(ch.below(2)):
        header[any_text(ch, 8)] = json_value(ch)
    return {k: v for k, v in header.items() if v is not _MISSING}


_MISSING = object()


def header_json(ch: Chooser) -> bytes:
    """The header as JSON bytes: valid, or with the JSON text or its bytes damaged."""
    text = json.dumps(header_dict(ch), ensure_ascii=bool(ch.below(2)))
    if _DEEP_JSON in text:  # deep nesting, or a number literal too long for int()
        depth = pick(ch, (10, 500, 990, 993, 995, 1000, 1100, 5000))
        opener, closer = pick(ch, (("[", "]"), ('{"x":', "}"), ("", "9")))
        text = text.replace(_DEEP_JSON, opener * depth + "1" + closer * depth, 1)
    data = text.encode("utf-8", "surrogatepass")
    if chance(ch, 4):
        data = mutate(ch, data)
    return data


def binary_header(ch: Chooser) -> bytes:
    """RocketMQ's own binary header serialization (serialize type 1), well-formed or not."""
    remark = any_text(ch).encode("utf-8", "surrogatepass") if ch.below(2) else b""
    ext = b""
    for _ in range(ch.below(5)):
        key = (pick(ch, EXT_KEYS) if ch.below(3) else any_text(ch, 8)).encode(
            "utf-8", "surrogatepass"
        )
        value = (
            str(any_int(ch)).encode()
            if ch.below(2)
            else any_text(ch).encode("utf-8", "surrogatepass")
        )
        ext += struct.pack(">h", len(key) & 0x7FFF) + key + struct.pack(">i", len(value)) + value
    data = (
        struct.pack(
            ">hBhii",
            pick(ch, CODES) & 0x7FFF,
            ch.below(BINARY_LANGUAGES),
            pick(ch, (0, 317, 396)),
            ch.below(2**31),
            pick(ch, (0, 1, 2)),
        )
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(ext))
        + ext
    )
    return mutate(ch, data) if chance(ch, 3) else data


# --- bodies and records -------------------------------------------------------------------------
def stored_message(ch: Chooser) -> StoredMessage:
    topic = topic_name(ch)
    if not _utf8_ok(topic) or len(topic.encode()) > 127:
        topic = "FuzzT"
    props = {
        any_text(ch, 8).replace("\x01", "").replace("\x02", ""): any_text(ch, 16).replace(
            "\x02", ""
        )
        for _ in range(ch.below(4))
    }
    props = {k: v for k, v in props.items() if k and _utf8_ok(k) and _utf8_ok(v)}
    return StoredMessage(
        topic=topic,
        queue_id=ch.below(8),
        body=ch.raw(200),
        flag=any_int(ch) & 0x7FFFFFFF,
        properties=props,
        born_timestamp=ch.below(2**41),
        born_host=pick(ch, ("127.0.0.1:1234", "10.0.0.1:9", "bad-host", "1.2.3.4:99999")),
        store_timestamp=ch.below(2**41),
        store_host="127.0.0.1:10911",
        sys_flag=pick(ch, (0, 1, 2, 4, 8, 12, 0x7FFFFFFF)),
        reconsume_times=ch.below(20),
        commit_log_offset=ch.below(2**40),
        queue_offset=ch.below(2**30),
        prepared_transaction_offset=ch.below(2**30),
    )


def _utf8_ok(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def message_records(ch: Chooser) -> bytes:
    """1-3 valid records (as a PULL body holds them), usually damaged afterwards."""
    data = b"".join(encode_message(stored_message(ch)) for _ in range(1 + ch.below(3)))
    if ch.below(5):
        data = mutate(
            ch, data, fields=(0, 4, 84, 88)
        )  # TOTALSIZE, MAGIC, BODYLEN, first body bytes
    return data


def batch_body(ch: Chooser) -> bytes:
    items = [
        BatchItem(body=ch.raw(100), flag=ch.below(2**31), properties=stored_message(ch).properties)
        for _ in range(1 + ch.below(4))
    ]
    data: bytes = encode_batch(items)
    if ch.below(4):
        data = mutate(ch, data, fields=(0, 16, 20))  # totalSize, bodyLen, body
    return data


def json_body(ch: Chooser) -> bytes:
    """Heartbeat / lock bodies (JSON) with fuzzed content."""
    body: dict[str, Any] = {
        "clientID": any_text(ch, 16),
        "producerDataSet": [{"groupName": any_text(ch, 12)} for _ in range(ch.below(3))],
        "consumerDataSet": [
            {
                "groupName": json_value(ch) if chance(ch, 3) else "Fz" + any_text(ch, 8),
                "consumeType": json_value(ch),
                "messageModel": pick(ch, ("CLUSTERING", "BROADCASTING", "x", 1)),
                "subscriptionDataSet": [
                    {"topic": topic_name(ch), "subString": any_text(ch), "tagsSet": json_value(ch)}
                    for _ in range(ch.below(3))
                ],
            }
            for _ in range(ch.below(3))
        ],
        "consumerGroup": any_text(ch, 12),
        "mqSet": [
            {"topic": topic_name(ch), "brokerName": any_text(ch, 8), "queueId": json_value(ch)}
            for _ in range(ch.below(3))
        ],
    }
    if chance(ch, 3):
        body = {k: v for k, v in body.items() if ch.below(2)}
        body[any_text(ch, 8)] = json_value(ch)
    text = json.dumps(body)
    if _DEEP_JSON in text:
        text = text.replace(_DEEP_JSON, "[" * 3000 + "]" * 3000, 1)
    data = text.encode("utf-8", "surrogatepass")
    return mutate(ch, data) if chance(ch, 4) else data


def body(ch: Chooser) -> bytes:
    kind = ch.below(6)
    if kind == 0:
        return b""
    if kind == 1:
        return batch_body(ch)
    if kind == 2:
        return message_records(ch)
    if kind == 3:
        return json_body(ch)
    return ch.raw(300)


# --- frames -------------------------------------------------------------------------------------
def frame_bytes(header: bytes, payload: bytes = b"", *, type_byte: int = 0) -> bytes:
    """One length-prefixed frame exactly as the codec lays it out (the fuzz starts from here)."""
    return (
        struct.pack(
            ">II",
            4 + len(header) + len(payload),
            ((type_byte & 0xFF) << 24) | (len(header) & 0xFFFFFF),
        )
        + header
        + payload
    )


def good_frame(ch: Chooser) -> bytes:
    """A frame built by the codec's own encoder (valid, random code/ext/body)."""
    ext = {k: v if isinstance(v, str) else json.dumps(v) for k, v in ext_fields(ch).items()}
    ext = {k: v for k, v in ext.items() if _utf8_ok(k) and _utf8_ok(v)}
    cmd = RemotingCommand(
        code=pick(ch, CODES),
        opaque=ch.below(2**31),
        flag=pick(ch, (0, 0, 0, 2, 1)),
        remark=any_text(ch) if chance(ch, 4) else None,
        ext_fields=ext,
        body=body(ch),
    )
    if chance(ch, 3):  # signed: past the ACL of a broker started with FUZZ_ACL (run.py --acl)
        sign_request(
            cmd,
            *pick(
                ch, (FUZZ_CREDENTIALS, FUZZ_CREDENTIALS, FUZZ_LIMITED, (FUZZ_ACCESS_KEY, "wrong"))
            ),
        )
    encoded: bytes = cmd.encode()
    return encoded


def frame(ch: Chooser, depth: int = 0) -> bytes:
    """One frame-shaped input: valid, damaged, truncated, oversized, foreign-serialized, or raw bytes."""
    shape = ch.below(13 if depth == 0 else 10)
    if shape in (0, 1):
        return good_frame(ch)
    if shape == 2:
        return frame_bytes(header_json(ch), body(ch))
    if shape == 3:  # valid JSON header, random serialize type byte
        return frame_bytes(header_json(ch), body(ch), type_byte=pick(ch, (1, 2, 0x80, 0xFF)))
    if (
        shape == 4
    ):  # RocketMQ binary serialization (type 1), as Java clients can be configured to send
        return frame_bytes(binary_header(ch), body(ch), type_byte=1 if ch.below(4) else 0)
    if shape == 5:  # garbage header bytes inside a well-formed frame
        return frame_bytes(ch.raw(200), body(ch), type_byte=0 if ch.below(3) else ch.below(256))
    if shape == 6:  # header-length word lies
        header, payload = header_json(ch), body(ch)
        damaged = bytearray(frame_bytes(header, payload))
        wrong = (len(header) + pick(ch, (-2, -1, 1, 2, 1000))) if ch.below(2) else any_int(ch)
        struct.pack_into(">I", damaged, 4, wrong & 0xFFFFFFFF)
        return bytes(damaged)
    if shape == 7:  # truncated
        data = good_frame(ch) if ch.below(2) else frame_bytes(header_json(ch), body(ch))
        return data[: ch.below(len(data))]
    if shape == 8:  # huge or absurd declared length, followed by a little data
        length = pick(
            ch,
            (
                MAX_FRAME_LENGTH,
                MAX_FRAME_LENGTH + 1,
                2**31,
                2**32 - 1,
                0,
                1,
                3,
                4,
                MAX_FRAME_LENGTH - 1,
                1 << 24,
                100000,
            ),
        )
        return struct.pack(">I", length) + ch.raw(64)
    if shape == 9:  # length word edits on a good frame
        edited = bytearray(good_frame(ch))
        struct.pack_into(
            ">I", edited, 0, (len(edited) - 4 + pick(ch, (-1, 1, -4, 4, 100))) & 0xFFFFFFFF
        )
        return bytes(edited)
    if shape == 10:  # pipelined: several frames on one connection
        return b"".join(frame(ch, depth + 1) for _ in range(2 + ch.below(4)))
    if shape == 11:
        return mutate(ch, good_frame(ch), fields=(0, 4))
    return ch.raw(512)


# --- mutation -----------------------------------------------------------------------------------
def mutate(ch: Chooser, data: bytes, fields: Sequence[int] = ()) -> bytes:
    """1-4 byte-level mutations; ``fields`` are offsets of 32-bit length/magic words worth hitting."""
    buf = bytearray(data)
    for _ in range(1 + ch.below(4)):
        op = ch.below(9)
        if op == 0 and buf:  # bit flip
            pos = ch.below(len(buf))
            buf[pos] ^= 1 << ch.below(8)
        elif op == 1 and buf:  # interesting byte
            buf[ch.below(len(buf))] = pick(ch, (0, 1, 0x7F, 0x80, 0xFF, 0x22, 0x5C, 0x7B, 0x7D))
        elif op == 2:  # insert bytes
            pos = ch.below(len(buf) + 1)
            buf[pos:pos] = ch.raw(16)
        elif op == 3 and buf:  # delete a range
            start = ch.below(len(buf))
            del buf[start : start + 1 + ch.below(16)]
        elif op == 4 and buf:  # truncate
            del buf[ch.below(len(buf)) :]
        elif op == 5 and len(buf) > 1:  # duplicate a chunk (splice with itself)
            start = ch.below(len(buf))
            chunk = buf[start : start + 1 + ch.below(32)]
            pos = ch.below(len(buf) + 1)
            buf[pos:pos] = chunk
        elif op == 6:  # splice random bytes over a range
            pos = ch.below(len(buf) + 1)
            piece = ch.raw(16)
            buf[pos : pos + len(piece)] = piece
        elif len(buf) >= 4:  # 32/16-bit length-field edit with an interesting value
            if fields and ch.below(2):
                pos = min(pick(ch, fields), len(buf) - 4)
            else:
                pos = ch.below(len(buf) - 3)
            if ch.below(4):
                struct.pack_into(">I", buf, pos, any_int(ch) & 0xFFFFFFFF)
            else:
                struct.pack_into(">H", buf, pos, any_int(ch) & 0xFFFF)
    return bytes(buf)


# --- in-process targets -------------------------------------------------------------------------
TARGETS: tuple[str, ...] = ("frame", "stream", "message", "batch", "props", "acl")
#: the exceptions each target may raise (anything else is a finding)
ALLOWED: dict[str, tuple[type[BaseException], ...]] = {
    "frame": (DecodeError,),
    "stream": (),
    "message": (MessageDecodeError,),
    "batch": (MessageDecodeError,),
    "props": (),
    "acl": (),
}


class FuzzFailure(AssertionError):
    """A property (round trip, transport model) does not hold for an input."""


def generate(ch: Chooser) -> tuple[str, bytes]:
    """Pick a target and build its input."""
    target = pick(ch, TARGETS)
    raw_mode = chance(ch, 5)
    if target == "frame":
        data = frame(ch)
        return target, (ch.raw(512) if raw_mode else data[4:] if len(data) >= 4 else data)
    if target == "stream":
        return target, ch.raw(512) if raw_mode else frame(ch)
    if target == "message":
        return target, ch.raw(512) if raw_mode else message_records(ch)
    if target == "batch":
        return target, ch.raw(512) if raw_mode else batch_body(ch)
    if target == "acl":  # first byte: the client's address (FUZZ_ADDRESSES), then a frame payload
        data = frame(ch)
        return target, bytes([ch.below(256)]) + (ch.raw(512) if raw_mode else data[4:])
    text = properties_to_string(stored_message(ch).properties).encode()
    return target, ch.raw(256) if raw_mode else mutate(ch, text) if ch.below(2) else text


def run_target(target: str, data: bytes) -> str:
    """Run one input; returns the outcome label ("ok" or the documented exception's name).

    Undocumented exceptions propagate (the caller reports them with the input); ``FuzzFailure`` is a
    broken property. Everything depends on ``data`` alone, so a finding reproduces from its hex:
    ``run_target("frame", bytes.fromhex("..."))``.
    """
    try:
        if target == "frame":
            check_frame(data)
        elif target == "stream":  # chunk boundaries derived from the data, for reproducibility
            check_stream(data, RandomChooser(random.Random(zlib.crc32(data))))
        elif target == "message":
            check_messages(data)
        elif target == "batch":
            decode_batch(data)
        elif target == "acl":
            check_acl(data)
        else:
            check_props(data)
    except ALLOWED[target] as exc:
        return type(exc).__name__
    return "ok"


def check_frame(payload: bytes) -> RemotingCommand:
    cmd = RemotingCommand.decode(payload)
    if type(cmd.code) is not int or not all(
        type(k) is str and type(v) is str for k, v in cmd.ext_fields.items()
    ):
        raise FuzzFailure(f"decoded field types are wrong: {cmd!r}")
    for key in cmd.ext_fields:  # what handlers do with the header: typed access
        with contextlib.suppress(ValueError):  # documented: a readable "must be an integer" error
            cmd.ext_int(key)
        cmd.ext_bool(key)
    back = RemotingCommand.decode(cmd.encode()[4:])
    if (back.code, back.opaque, back.flag, back.remark, back.ext_fields, back.body) != (
        cmd.code,
        cmd.opaque,
        cmd.flag,
        cmd.remark,
        cmd.ext_fields,
        cmd.body,
    ):
        raise FuzzFailure("decode(encode(decode(x))) differs from decode(x)")
    cmd.error(1, "x").encode()  # the error answer for this request can always be written
    return cmd


def check_messages(data: bytes) -> None:
    msgs = decode_messages(data)
    decode_message(data, verify_crc=True)
    for msg in msgs:
        _ = msg.uniq_key, msg.tags, msg.store_size


_VALIDATOR = AccessValidator(parse_acl(FUZZ_ACL))
_ACL_PREFIX = "org.apache.rocketmq.acl.common.AclException"


def check_acl(data: bytes) -> None:
    """The ACL check on one request: a refusal is SYSTEM_ERROR with an AclException remark; the right
    signature always passes the signature check, a change after signing never does."""
    if not data:
        return
    addr = FUZZ_ADDRESSES[data[0] % len(FUZZ_ADDRESSES)]
    try:
        cmd = RemotingCommand.decode(data[1:])
    except DecodeError:
        return
    _acl_answer(cmd, addr)
    sign_request(cmd, *FUZZ_CREDENTIALS)
    remark = _acl_answer(cmd, "127.0.0.1:1")  # not white-listed: the signature is checked
    if remark is not None and "PlainAccessValidator.parse" not in remark:
        raise FuzzFailure(f"a correctly signed admin request was refused: {remark}")
    cmd.body += b"!"
    if _acl_answer(cmd, "127.0.0.1:1") is None:
        raise FuzzFailure("a request changed after signing was let through")


def _acl_answer(cmd: RemotingCommand, addr: str) -> str | None:
    answer = _VALIDATOR.refusal(cmd, addr)
    if answer is None:
        return None
    if (
        answer.code != 1
        or not (answer.remark or "").startswith(_ACL_PREFIX)
        or not answer.is_response
    ):
        raise FuzzFailure(f"bad ACL refusal: code {answer.code} remark {answer.remark!r}")
    answer.encode()  # the refusal can always be written
    return answer.remark


def check_props(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    props = string_to_properties(text)
    expected = {k: v for k, v in props.items() if v != ""}
    again = string_to_properties(properties_to_string(props))
    if again != expected:
        raise FuzzFailure(f"properties round trip differs: {props!r} -> {again!r}")


# --- the server's framing loop, in process ------------------------------------------------------
class _MemoryTransport(asyncio.Transport):
    """Just enough of a transport for ``FrameProtocol``: collects writes, records close()."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 10911)}.get(
            name, default
        )

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@dataclass
class FrameWalk:
    """What a correct server does with a byte stream (the model the live checks compare against)."""

    requests: int  # complete frames that decode
    answers: int  # of which are neither responses nor oneway: each must be answered exactly once
    closes: bool  # a bad length or an undecodable frame: the server must drop the connection
    clean_end: bool  # the data ends exactly at a frame boundary (a following probe frame is read)
    #: a header nested so deeply that whether it decodes depends on the caller's stack depth (the
    #: recursion limit): the model cannot predict the server, so callers skip the model comparison
    uncertain: bool = False


#: brackets in one header beyond which decoding may hit the recursion limit (the limit is 1000)
_DEPTH_SENSITIVE = 800


def walk_frames(data: bytes) -> FrameWalk:
    pos = requests = answers = 0
    uncertain = False
    while len(data) - pos >= 4:
        length = int.from_bytes(data[pos : pos + 4], "big")
        if length < 4 or length > MAX_FRAME_LENGTH:
            return FrameWalk(requests, answers, True, False, uncertain)
        if len(data) - pos - 4 < length:
            return FrameWalk(requests, answers, False, False, uncertain)
        payload = data[pos + 4 : pos + 4 + length]
        header = payload[4 : 4 + int.from_bytes(payload[:4], "big")]
        if header.count(b"[") + header.count(b"{") > _DEPTH_SENSITIVE:
            uncertain = True
        try:
            cmd = RemotingCommand.decode(payload)
        except Exception:  # noqa: BLE001 - DecodeError, or a decoder bug: either way the server drops us
            return FrameWalk(requests, answers, True, False, uncertain)
        requests += 1
        if not cmd.is_response and not cmd.is_oneway:
            answers += 1
        pos += 4 + length
    return FrameWalk(requests, answers, False, pos == len(data), uncertain)


def parse_frames(data: bytes) -> tuple[list[RemotingCommand], bytes]:
    """Split server output into commands; returns (commands, undecodable rest)."""
    out: list[RemotingCommand] = []
    pos = 0
    while len(data) - pos >= 4:
        length = int.from_bytes(data[pos : pos + 4], "big")
        if length < 4 or len(data) - pos - 4 < length:
            break
        try:
            out.append(RemotingCommand.decode(data[pos + 4 : pos + 4 + length]))
        except Exception:  # noqa: BLE001 - reported as a leftover: the server wrote something invalid
            break
        pos += 4 + length
    return out, data[pos:]


_SERVER_ERRORS: list[str] = []


async def _typed_handler(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    """Reads every ext field as an int, as real handlers read their fields (ValueError = bad request)."""
    for key in cmd.ext_fields:
        cmd.ext_int(key)
    return cmd.response()


def _memory_server() -> RemotingServer:
    server = RemotingServer("fuzz", "127.0.0.1", 0)
    server.on_error = _SERVER_ERRORS.append
    for code in (SEND_MESSAGE, SEND_MESSAGE_V2, 11, 105):
        server.register(code, _typed_handler, inline=True)
    return server


_SERVER = _memory_server()
#: the same server with the ACL hook (``acl.py``), for half of the ``stream`` inputs
_ACL_SERVER = _memory_server()
_ACL_SERVER.request_hook = lambda cmd, conn: _VALIDATOR.refusal(cmd, conn.remote_addr)


def check_stream(data: bytes, ch: Chooser | None = None) -> None:
    transport = _MemoryTransport()
    protocol = FrameProtocol(_ACL_SERVER if zlib.crc32(data) & 1 else _SERVER)
    protocol.connection_made(transport)
    conn = protocol.conn
    if conn is None:
        raise RuntimeError("FrameProtocol.connection_made() set no connection")
    pos = 0
    del _SERVER_ERRORS[:]
    while pos < len(data) and not conn.closed:
        step = 1 + (ch.below(len(data) - pos) if ch is not None else len(data))
        protocol.data_received(data[pos : pos + step])
        pos += step
    closed, transport_closed = conn.closed, transport.closed
    protocol.connection_lost(None)
    for text in _SERVER_ERRORS:
        if "bad frame" not in text:
            raise FuzzFailure(f"the server reported a handler failure: {text.splitlines()[0]}")
    model = walk_frames(data)
    answers, rest = parse_frames(bytes(transport.out))
    if rest:
        raise FuzzFailure(f"the server wrote {len(rest)} bytes that are not a whole frame")
    for answer in answers:
        if not answer.is_response or "internal error" in (answer.remark or ""):
            raise FuzzFailure(f"bad answer: code {answer.code} remark {answer.remark!r}")
    if model.uncertain:
        return
    if model.closes != closed or closed != transport_closed:
        raise FuzzFailure(f"connection closed={closed}, expected {model.closes}")
    if len(answers) != model.answers:
        raise FuzzFailure(f"{len(answers)} answers for {model.answers} requests that need one")
