"""The binary message layout RocketMQ uses on disk, in PULL bodies and in CHECK_TRANSACTION_STATE bodies.

Record (big-endian, IPv4 hosts only - librocketmq cannot read the IPv6 variant)::

    TOTALSIZE i32 | MAGIC i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 |
    PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST 4+i32 | STORETIMESTAMP i64 |
    STOREHOST 4+i32 | RECONSUMETIMES i32 | PREPARED_TX_OFFSET i64 |
    BODYLEN i32 + body | TOPICLEN i8 + topic | PROPLEN i16 + properties

The commit log stores exactly these records, so a stored record is already a valid PULL body entry.
Properties are ``key\\x01value\\x02`` pairs. Message ids (``offsetMsgId``) are the uppercase hex of
store IPv4 + store port + commit-log offset.
"""

from __future__ import annotations

import functools
import socket
import struct
import zlib
from dataclasses import dataclass, field

MAGIC = 0xDAA320A7
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_TYPE_MASK = 0xC

MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767

# property names (MessageConst)
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_TRAN_MSG = "TRAN_MSG"
PROPERTY_PGROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_CLUSTER = "CLUSTER"
#: 5.x ``TransactionalMessageUtil.TRANSACTION_ID``: the half message's ``UNIQ_KEY`` again
PROPERTY_TRANSACTION_ID = "__transactionId__"

#            total magic crc qid flag qoff  phys  sys born  bornhost   store storehost recon prep
_FIXED = struct.Struct(">iIiiiqqiq4siq4siiq")
FIXED_SIZE = _FIXED.size  # 84
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


class MessageDecodeError(ValueError):
    """Bytes that are not a valid message record."""


@dataclass
class StoredMessage:
    """A message as the store keeps it. Offsets/ids are assigned by ``MessageStore.put``.

    ``body`` is kept as received: zlib-compressed when ``sys_flag & SYSFLAG_COMPRESSED`` (clients inflate).
    Hosts are ``"ip:port"`` strings (IPv4).
    """

    topic: str
    queue_id: int
    body: bytes
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    store_timestamp: int = 0
    store_host: str = "127.0.0.1:0"
    sys_flag: int = 0
    reconsume_times: int = 0
    commit_log_offset: int = -1
    queue_offset: int = -1
    msg_id: str = ""
    prepared_transaction_offset: int = 0

    @property
    def uniq_key(self) -> str:
        """The client-visible message id (``UNIQ_KEY``), falling back to the offset message id."""
        return self.properties.get(PROPERTY_UNIQ_KEY) or self.msg_id

    @property
    def tags(self) -> str:
        return self.properties.get(PROPERTY_TAGS, "")

    def plain_body(self) -> bytes:
        """The body with zlib compression undone (for inspection/tests)."""
        if self.sys_flag & SYSFLAG_COMPRESSED:
            return zlib.decompress(self.body)
        return self.body

    @property
    def store_size(self) -> int:
        return encoded_size(self)


def clone(msg: StoredMessage, **changes: object) -> StoredMessage:
    """A shallow copy with some fields changed (several times faster than ``dataclasses.replace``).

    The properties dict is shared unless ``properties=`` is passed: never mutate it in place.
    """
    new = object.__new__(StoredMessage)
    new.__dict__.update(msg.__dict__)
    new.__dict__.update(changes)
    return new


# --- properties ----------------------------------------------------------------------------------
def properties_to_string(props: dict[str, str]) -> str:
    """``k\\x01v\\x02`` per pair. Pairs with empty keys/values are dropped (CPP would lose them anyway)."""
    return "".join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}"
        for k, v in props.items()
        if k and v != ""
    )


def string_to_properties(text: str) -> dict[str, str]:
    """Parse properties leniently: empty tokens and tokens without a separator are ignored."""
    props: dict[str, str] = {}
    if not text:
        return props
    for item in text.split(PROPERTY_SEPARATOR):
        if not item:
            continue
        key, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and key:
            props[key] = value
    return props


# --- hosts and ids -------------------------------------------------------------------------------
def split_host(host: str) -> tuple[str, int]:
    ip, _, port = host.rpartition(":")
    if not ip:
        return host or "127.0.0.1", 0
    try:
        return ip, int(port)
    except ValueError:
        return ip, 0


@functools.lru_cache(maxsize=4096)
def _pack_host(host: str) -> tuple[bytes, int]:
    ip, port = split_host(host)
    try:
        packed = socket.inet_aton(ip)
    except OSError:
        packed = b"\x7f\x00\x00\x01"
    return packed, port


def _unpack_host(raw: bytes, port: int) -> str:
    return f"{socket.inet_ntoa(raw)}:{port}"


@functools.lru_cache(maxsize=64)
def _host_id_prefix(store_host: str) -> str:
    packed, port = _pack_host(store_host)
    return (packed + struct.pack(">i", port)).hex().upper()


def offset_msg_id(store_host: str, commit_log_offset: int) -> str:
    """32 uppercase hex chars: IPv4 (4) + port (4) + commit-log offset (8)."""
    return f"{_host_id_prefix(store_host)}{commit_log_offset & 0xFFFFFFFFFFFFFFFF:016X}"


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of ``offset_msg_id``: returns (``"ip:port"``, commit_log_offset)."""
    if len(msg_id) != 32:
        raise ValueError(f"offset message id must have 32 hex chars, got {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    port, offset = struct.unpack(">iq", raw[4:])
    return _unpack_host(raw[:4], port), offset


# --- records -------------------------------------------------------------------------------------
def encoded_size(msg: StoredMessage) -> int:
    return (
        FIXED_SIZE
        + 4
        + len(msg.body)
        + 1
        + len(msg.topic.encode())
        + 2
        + len(properties_to_string(msg.properties).encode())
    )


def encode_message(
    msg: StoredMessage, *, topic: str | None = None, queue_id: int | None = None
) -> bytes:
    """Encode one record; ``topic``/``queue_id`` override the stored ones (e.g. REAL_TOPIC for checks)."""
    topic_bytes = (msg.topic if topic is None else topic).encode()
    if len(topic_bytes) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic longer than {MAX_TOPIC_BYTES} bytes")
    props = properties_to_string(msg.properties).encode()
    if len(props) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties longer than {MAX_PROPERTIES_BYTES} bytes")
    body = msg.body
    total = FIXED_SIZE + 4 + len(body) + 1 + len(topic_bytes) + 2 + len(props)
    born_ip, born_port = _pack_host(msg.born_host)
    store_ip, store_port = _pack_host(msg.store_host)
    try:
        fixed = _FIXED.pack(
            total,
            MAGIC,
            zlib.crc32(body) & 0x7FFFFFFF,
            msg.queue_id if queue_id is None else queue_id,
            msg.flag,
            msg.queue_offset,
            msg.commit_log_offset,
            msg.sys_flag,
            msg.born_timestamp,
            born_ip,
            born_port,
            msg.store_timestamp,
            store_ip,
            store_port,
            msg.reconsume_times,
            msg.prepared_transaction_offset,
        )
    except struct.error as exc:  # e.g. a send header's flag/bornTimestamp beyond int32/int64
        raise ValueError(f"message field out of range for the record layout: {exc}") from None
    return b"".join(
        (
            fixed,
            _I32.pack(len(body)),
            body,
            bytes((len(topic_bytes),)),
            topic_bytes,
            _I16.pack(len(props)),
            props,
        )
    )


def decode_message(
    data: bytes | memoryview, pos: int = 0, *, verify_crc: bool = False
) -> tuple[StoredMessage, int]:
    """Decode the record at ``pos``; returns (message, position after it)."""
    view = memoryview(data)
    if len(view) - pos < FIXED_SIZE + 4:
        raise MessageDecodeError("truncated record header")
    (
        total,
        magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        phys,
        sys_flag,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume,
        prepared,
    ) = _FIXED.unpack_from(view, pos)
    if magic != MAGIC:
        raise MessageDecodeError(f"bad magic code 0x{magic:08X}")
    if total < FIXED_SIZE + 7 or total > len(view) - pos:
        raise MessageDecodeError(f"record size {total} is invalid or truncated")
    end = pos + total
    cur = pos + FIXED_SIZE
    (body_len,) = _I32.unpack_from(view, cur)
    cur += 4
    if body_len < 0 or cur + body_len + 3 > end:
        raise MessageDecodeError("body length does not fit the record")
    body = bytes(view[cur : cur + body_len])
    cur += body_len
    topic_len = view[cur]
    cur += 1
    if cur + topic_len + 2 > end:
        raise MessageDecodeError("topic length does not fit the record")
    topic = bytes(view[cur : cur + topic_len]).decode("utf-8", "replace")
    cur += topic_len
    (prop_len,) = _I16.unpack_from(view, cur)
    cur += 2
    if prop_len < 0 or cur + prop_len != end:
        raise MessageDecodeError("properties length does not match the record size")
    props = string_to_properties(bytes(view[cur : cur + prop_len]).decode("utf-8", "replace"))
    if verify_crc and (zlib.crc32(body) & 0x7FFFFFFF) != crc:
        raise MessageDecodeError("body CRC mismatch")
    store_host = _unpack_host(store_ip, store_port)
    msg = StoredMessage(
        topic=topic,
        queue_id=queue_id,
        body=body,
        flag=flag,
        properties=props,
        born_timestamp=born_ts,
        born_host=_unpack_host(born_ip, born_port),
        store_timestamp=store_ts,
        store_host=store_host,
        sys_flag=sys_flag,
        reconsume_times=reconsume,
        commit_log_offset=phys,
        queue_offset=queue_offset,
        msg_id=offset_msg_id(store_host, phys),
        prepared_transaction_offset=prepared,
    )
    return msg, end


def decode_messages(data: bytes) -> list[StoredMessage]:
    """Decode a concatenation of records (a PULL body)."""
    out: list[StoredMessage] = []
    pos = 0
    while pos < len(data):
        msg, pos = decode_message(data, pos)
        out.append(msg)
    return out


# --- batch send bodies ---------------------------------------------------------------------------
_BATCH_HEAD = struct.Struct(">iiiii")  # totalSize, magic, bodyCRC, flag, bodyLen


@dataclass
class BatchItem:
    body: bytes
    flag: int
    properties: dict[str, str]


def decode_batch(data: bytes) -> list[BatchItem]:
    """Split a batch send body: [total i32, magic i32, crc i32, flag i32, bodyLen i32, body, propLen i16, props]*."""
    items: list[BatchItem] = []
    pos = 0
    view = memoryview(data)
    while pos < len(view):
        if len(view) - pos < _BATCH_HEAD.size:
            raise MessageDecodeError("truncated batch entry")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(view, pos)
        cur = pos + _BATCH_HEAD.size
        if body_len < 0 or cur + body_len + 2 > len(view):
            raise MessageDecodeError("batch entry body length out of range")
        body = bytes(view[cur : cur + body_len])
        cur += body_len
        (prop_len,) = _I16.unpack_from(view, cur)
        cur += 2
        if prop_len < 0 or cur + prop_len > len(view):
            raise MessageDecodeError("batch entry properties length out of range")
        props = string_to_properties(bytes(view[cur : cur + prop_len]).decode("utf-8", "replace"))
        cur += prop_len
        if total > 0 and pos + total != cur:
            # CPP fills totalSize correctly; trust our own parse when it disagrees, but never loop.
            pass
        items.append(BatchItem(body=body, flag=flag, properties=props))
        pos = cur
    return items


def encode_batch(items: list[BatchItem]) -> bytes:
    """The client side of ``decode_batch`` (used by tests and our own tools)."""
    out = []
    for item in items:
        props = properties_to_string(item.properties).encode()
        total = _BATCH_HEAD.size + len(item.body) + 2 + len(props)
        out.append(_BATCH_HEAD.pack(total, 0, 0, item.flag, len(item.body)))
        out.append(item.body)
        out.append(_I16.pack(len(props)))
        out.append(props)
    return b"".join(out)
