"""RocketMQ 4.x remoting frames: one ``RemotingCommand`` per length-prefixed frame.

Frame layout (all big-endian)::

    int32 length            = 4 + headerLen + bodyLen (does not count itself)
    int32 type|headerLen    high byte = serialize type (0 = JSON), low 24 bits = header length
    header                  UTF-8 JSON
    body                    raw bytes

We only speak JSON headers: librocketmq reads the second word as the header length without masking
the type byte, so anything we send must use type 0. Decoding is strict and raises ``DecodeError``
for every malformed frame so that a server can drop one bad connection without crashing.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

# --- request codes -------------------------------------------------------------------------
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
UPDATE_AND_CREATE_TOPIC = 17
GET_MIN_OFFSET = 31
GET_MAX_OFFSET = 30
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_EARLIEST_MSG_STORETIME = 32
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
CONSUMER_SEND_MSG_BACK = 36
END_TRANSACTION = 37
GET_CONSUMER_LIST_BY_GROUP = 38
CHECK_TRANSACTION_STATE = 39
NOTIFY_CONSUMER_IDS_CHANGED = 40
LOCK_BATCH_MQ = 41
UNLOCK_BATCH_MQ = 42
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320

# --- response codes ------------------------------------------------------------------------
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
FLUSH_DISK_TIMEOUT = 10
SLAVE_NOT_AVAILABLE = 11
FLUSH_SLAVE_TIMEOUT = 12
MESSAGE_ILLEGAL = 13
SERVICE_NOT_AVAILABLE = 14
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22

FLAG_RESPONSE = 1
FLAG_ONEWAY = 2

#: Java's NettyDecoder refuses frames above 16 MiB; so do we (a 4 MiB message plus headers fits).
MAX_FRAME_LENGTH = 16 * 1024 * 1024
#: Version ordinal we announce (Java 4.9.7's V4_9_7 is 396; clients ignore it).
SERVER_VERSION = 396

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True)
_DECODER = json.JSONDecoder()
_WORD = struct.Struct(">I")
_TWO_WORDS = struct.Struct(">II")


class DecodeError(ValueError):
    """A frame or header that is not valid RocketMQ remoting data (the connection should be dropped)."""


def _ext_str(value: Any) -> str:
    """Coerce one extFields value to the string Java's fastjson would have produced."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"))


@dataclass
class RemotingCommand:
    """One request or response. ``ext_fields`` values are always strings."""

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = "JAVA"
    version: int = SERVER_VERSION
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    # -- classification ---------------------------------------------------------------------
    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: dict[str, Any] | None = None,
        body: bytes = b"",
        *,
        opaque: int = 0,
        oneway: bool = False,
    ) -> RemotingCommand:
        ext = {k: _ext_str(v) for k, v in (ext_fields or {}).items()}
        return cls(
            code=code, opaque=opaque, flag=FLAG_ONEWAY if oneway else 0, ext_fields=ext, body=body
        )

    def response(
        self,
        code: int = SUCCESS,
        remark: str | None = None,
        ext_fields: dict[str, Any] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """Build the response to this request (echoes opaque, sets the response flag)."""
        ext = {k: _ext_str(v) for k, v in (ext_fields or {}).items()}
        return RemotingCommand(
            code=code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=ext,
            body=body,
        )

    def error(self, code: int, remark: str) -> RemotingCommand:
        return self.response(code, remark)

    # -- typed ext access (clients send numbers or strings; errors become DecodeError-free None) --
    def ext(self, key: str, default: str = "") -> str:
        return self.ext_fields.get(key, default)

    def ext_int(self, key: str, default: int | None = None) -> int:
        """An integer ext field; raises ``ValueError`` with a readable message when missing/invalid."""
        raw = self.ext_fields.get(key)
        if raw is None or raw == "":
            if default is not None:
                return default
            raise ValueError(f"missing header field {key!r}")
        try:
            return int(raw)
        except ValueError:
            try:
                as_float = float(raw)
                if as_float == int(as_float):  # int() raises OverflowError for "inf", "1e400"
                    return int(as_float)
            except (ValueError, OverflowError):
                pass
            raise ValueError(f"header field {key!r} must be an integer, got {raw!r}") from None

    def ext_bool(self, key: str, default: bool = False) -> bool:
        """A Boolean header field as the real broker decodes it: Java's ``Boolean.parseBoolean``
        (4.9.8 ``RemotingCommand.decodeCommandCustomHeader``, 5.3.3's fast decoders), so only
        "true" in any case is true.  librocketmq 2.1.0 sends ``"1"``/``"0"``: false to a real
        broker (its batch flag ``m=1`` makes a real broker store the batch as one message)."""
        raw = self.ext_fields.get(key)
        if raw is None:
            return default
        return raw.lower() == "true"

    # -- wire format ------------------------------------------------------------------------
    def header_json(self) -> bytes:
        header: dict[str, Any] = {
            "code": self.code,
            "extFields": self.ext_fields,
            "flag": self.flag,
            "language": self.language,
            "opaque": self.opaque,
            "serializeTypeCurrentRPC": "JSON",
            "version": self.version,
        }
        if self.remark is not None:
            header["remark"] = self.remark
        return _ENCODER.encode(header).encode("ascii")

    def encode(self) -> bytes:
        """The complete frame including the leading length word."""
        header = self.header_json()
        body = self.body or b""
        return _TWO_WORDS.pack(4 + len(header) + len(body), len(header)) + header + body

    @classmethod
    def decode(cls, payload: bytes) -> RemotingCommand:
        """Decode a frame *without* its leading length word (the transport strips it)."""
        if len(payload) < 4:
            raise DecodeError(
                f"frame of {len(payload)} bytes is shorter than its header-length word"
            )
        (word,) = _WORD.unpack_from(payload, 0)
        serialize_type = word >> 24
        header_len = word & 0xFFFFFF
        if serialize_type != 0:
            raise DecodeError(f"unsupported serialize type {serialize_type} (only JSON = 0)")
        if header_len > len(payload) - 4:
            raise DecodeError(
                f"header length {header_len} exceeds the frame's remaining {len(payload) - 4} bytes"
            )
        raw_header = payload[4 : 4 + header_len]
        body = bytes(payload[4 + header_len :])
        try:
            # json.loads(bytes) sniffs the encoding first and is ~3x slower than decoding ourselves
            header = _DECODER.decode(raw_header.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            # ValueError also covers number literals longer than int()'s 4300-digit limit
            raise DecodeError(f"header is not valid JSON: {exc}") from None
        if not isinstance(header, dict):
            raise DecodeError("header JSON must be an object")
        code = header.get("code")
        if isinstance(code, str) and code.lstrip("-").isdigit():
            try:
                code = int(code)
            except ValueError:  # "--5", "\u00b2" (isdigit but not int), over 4300 digits
                raise DecodeError(f"header field 'code' must be an integer, got {code!r}") from None
        if not isinstance(code, int) or isinstance(code, bool):
            raise DecodeError(f"header field 'code' must be an integer, got {code!r}")
        opaque = _int_field(header, "opaque")
        flag = _int_field(header, "flag")
        version = _int_field(header, "version")
        ext_raw = header.get("extFields") or {}
        if not isinstance(ext_raw, dict):
            raise DecodeError("header field 'extFields' must be an object")
        try:
            ext = {str(k): v if type(v) is str else _ext_str(v) for k, v in ext_raw.items()}
        except (
            RecursionError
        ):  # nesting the parser just accepted can still be too deep to re-serialize
            raise DecodeError("header field 'extFields' is nested too deeply") from None
        remark = header.get("remark")
        language = header.get("language")
        return cls(
            code=code,
            opaque=opaque,
            flag=flag,
            language=language if isinstance(language, str) else "UNKNOWN",
            version=version,
            remark=remark if isinstance(remark, str) else None,
            ext_fields=ext,
            body=body,
        )


def _int_field(header: dict[str, Any], key: str) -> int:
    value = header.get(key, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise DecodeError(f"header field {key!r} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise DecodeError(f"header field {key!r} must be an integer, got {value!r}") from None
