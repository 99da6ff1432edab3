"""RocketMQ 4.9.x ACL on the broker port (``txmsg broker --acl plain_acl.yml``).

Checked against the 4.9.8 sources (``PlainAccessValidator``, ``PlainPermissionManager``, ``Permission``,
``AclUtils``, ``NettyRemotingAbstract.processRequestCommand``) and rocketmq-client-cpp 2.1.0's
``ClientRPCHook`` (what librocketmq actually signs):

* **Every request to the broker** is checked, whatever its code (4.9.8 runs the check as an RPC hook
  before any processor, the default processor included); the name server checks nothing.
* **Signature**: HMAC-SHA1 with the account's secretKey over the values of all ext fields except
  ``Signature`` (and ``_UNIQUE_KEY_QUERY``), sorted by key, concatenated, followed by the body;
  base64. librocketmq signs ``AccessKey``, ``OnsChannel`` and its header's fields - exactly the ext
  fields it then sends - so both computations agree (:func:`signing_content`).
* **Order** (``PlainPermissionManager.validate``): a global white address lets everything in; else no
  ``AccessKey`` → "No accessKey is configured"; an unknown key → "No acl config for <key>"; the
  account's own ``whiteRemoteAddress`` lets it in without signature; a wrong or missing signature →
  "Check signature failed for accessKey=<key>"; then admin-only codes and the resources of the request
  (the request-code table of ``PlainAccessValidator.parse``: sends need PUB on the topic, or SUB on
  the group for ``%RETRY%`` topics; pulls SUB on topic and group; heartbeats SUB on every consumer
  group and subscribed topic; unregister, consumer list, offset commits SUB on the group (and topic);
  send-back SUB on the group) → "No default permission for topic:<t>" / "group:<g>".
  Other codes (END_TRANSACTION, batch sends, offset queries ...) need a valid signature only, as in 4.9.8.
* **Refusal**: 4.9.8 answers an ``AclException`` like any exception of a request: response code
  **SYSTEM_ERROR (1)**, remark ``RemotingHelper.exceptionSimpleDesc`` = the exception and its first
  stack frame, e.g. ``org.apache.rocketmq.acl.common.AclException: Check signature failed for
  accessKey=RocketMQ, org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java:684)``.
  (Not NO_PERMISSION 16: that is a 5.x proxy/gRPC answer.) Oneway requests get no answer. The request
  never reaches its handler, so a refused send stores nothing. broker.log gets a WARN line per refusal.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .acl_config import (
    PUB,
    RETRY_PREFIX,
    SUB,
    Account,
    AclConfig,
    check_perm,
    load_acl,
)
from .codec import (
    CONSUMER_SEND_MSG_BACK,
    GET_CONSUMER_LIST_BY_GROUP,
    HEART_BEAT,
    PULL_MESSAGE,
    SEND_MESSAGE,
    SEND_MESSAGE_V2,
    SYSTEM_ERROR,
    UNREGISTER_CLIENT,
    UPDATE_AND_CREATE_TOPIC,
    UPDATE_CONSUMER_OFFSET,
    RemotingCommand,
)

if TYPE_CHECKING:
    from .broker import Broker
    from .transport import Connection

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"  # noqa: S105 - a header field name, not a secret
#: librocketmq adds it to every signed request (its ``authChannel``, "ALIYUN" by default)
ONS_CHANNEL = "OnsChannel"
#: MixAll.UNIQUE_MSG_QUERY_FLAG: left out of the broker's signature content
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
#: fields an ACL-signed request carries (the fuzz harness mutates them)
ACL_FIELDS = (ACCESS_KEY, SIGNATURE, SECURITY_TOKEN, ONS_CHANNEL)

QUERY_MESSAGE = 12
#: Permission.ADMIN_CODE: UPDATE_AND_CREATE_TOPIC, UPDATE_BROKER_CONFIG, DELETE_TOPIC_IN_BROKER,
#: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP
ADMIN_CODES = frozenset({UPDATE_AND_CREATE_TOPIC, 25, 215, 200, 207})
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"

_EXCEPTION = "org.apache.rocketmq.acl.common.AclException"
_MANAGER = "org.apache.rocketmq.acl.plain.PlainPermissionManager"
#: first stack frame of each 4.9.8 AclException (RemotingHelper.exceptionSimpleDesc shows it)
_AT_PARSE = (
    "org.apache.rocketmq.acl.plain.PlainAccessValidator.parse(PlainAccessValidator.java:134)"
)
_AT_NO_KEY = f"{_MANAGER}.validate(PlainPermissionManager.java:664)"
_AT_UNKNOWN_KEY = f"{_MANAGER}.validate(PlainPermissionManager.java:668)"
_AT_SIGNATURE = f"{_MANAGER}.validate(PlainPermissionManager.java:684)"
_AT_ADMIN = f"{_MANAGER}.checkPerm(PlainPermissionManager.java:581)"
_AT_DEFAULT_PERM = f"{_MANAGER}.checkPerm(PlainPermissionManager.java:606)"
_AT_PERM = f"{_MANAGER}.checkPerm(PlainPermissionManager.java:611)"


class AclRefused(Exception):
    """One refusal: ``remark`` is what 4.9.8 puts in the SYSTEM_ERROR response."""

    def __init__(self, message: str | None, frame: str) -> None:
        self.message = message
        text = _EXCEPTION if message is None else f"{_EXCEPTION}: {message}"
        self.remark = f"{text}, {frame}"
        super().__init__(self.remark)


# --- signature -----------------------------------------------------------------------------------
def _java_order(key: str) -> bytes:
    """Java's ``String.compareTo`` order (UTF-16 code units), which ``TreeMap`` sorts by."""
    return key.encode("utf-16-be", "surrogatepass")


def signing_content(ext_fields: Mapping[str, str], body: bytes | None) -> bytes:
    """What 4.9.8 signs: the ext field values (without Signature / _UNIQUE_KEY_QUERY) in key order,
    then the body."""
    keys = sorted(
        (k for k in ext_fields if k not in (SIGNATURE, UNIQUE_MSG_QUERY_FLAG)), key=_java_order
    )
    text = "".join(ext_fields[k] for k in keys)
    return text.encode("utf-8", "surrogatepass") + (body or b"")


def calc_signature(content: bytes, secret_key: str) -> str:
    """``AclSigner.calSignature``: base64(HMAC-SHA1(secretKey, content))."""
    digest = hmac.new(secret_key.encode("utf-8", "surrogatepass"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign_request(
    cmd: RemotingCommand, access_key: str, secret_key: str, *, security_token: str | None = None
) -> RemotingCommand:
    """Sign ``cmd`` in place as 4.9.8's ``AclClientRPCHook`` does (tools and tests: ``txmsg topic create``)."""
    cmd.ext_fields[ACCESS_KEY] = access_key
    if security_token is not None:
        cmd.ext_fields[SECURITY_TOKEN] = security_token
    cmd.ext_fields[SIGNATURE] = calc_signature(
        signing_content(cmd.ext_fields, cmd.body), secret_key
    )
    return cmd


# --- the request-code table (PlainAccessValidator.parse) -----------------------------------------
def _retry(group: str | None) -> str | None:
    return None if group is None else RETRY_PREFIX + group


def needed_resources(cmd: RemotingCommand) -> dict[str, int]:
    """resource -> needed perm, in insertion order (``%RETRY%<group>`` stands for the group).

    Raises :class:`AclRefused` where 4.9.8's parse fails (a heartbeat body that is not HeartbeatData)."""
    ext = cmd.ext_fields
    needed: dict[str, int] = {}

    def add(resource: str | None, perm: int) -> None:
        if resource is not None:
            needed[resource] = perm

    code = cmd.code
    if code in (SEND_MESSAGE, SEND_MESSAGE_V2):
        topic_key, group_key = ("topic", "group") if code == SEND_MESSAGE else ("b", "a")
        topic = ext.get(topic_key)
        if topic is not None and topic.startswith(RETRY_PREFIX):
            add(_retry(ext.get(group_key)), SUB)
        else:
            add(topic, PUB)
    elif code == CONSUMER_SEND_MSG_BACK:
        add(_retry(ext.get("group")), SUB)
    elif code == PULL_MESSAGE:
        add(ext.get("topic"), SUB)
        add(_retry(ext.get("consumerGroup")), SUB)
    elif code == QUERY_MESSAGE:
        add(ext.get("topic"), SUB)
    elif code == HEART_BEAT:
        for group, topics in _heartbeat_consumers(cmd.body):
            add(_retry(group), SUB)
            for topic in topics:
                add(topic, SUB)
    elif code in (UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP):
        add(_retry(ext.get("consumerGroup")), SUB)
    elif code == UPDATE_CONSUMER_OFFSET:
        add(_retry(ext.get("consumerGroup")), SUB)
        add(ext.get("topic"), SUB)
    return needed


def _heartbeat_consumers(body: bytes | None) -> list[tuple[str | None, list[str | None]]]:
    """(group, subscribed topics) of every consumer in a HeartbeatData body."""
    if not body:
        raise AclRefused(None, _AT_PARSE)  # 4.9.8: a NullPointerException without message
    try:
        data: Any = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AclRefused(f"heartbeat body is not HeartbeatData JSON: {exc}", _AT_PARSE) from None
    if not isinstance(data, dict):
        raise AclRefused(None, _AT_PARSE)
    found: list[tuple[str | None, list[str | None]]] = []
    consumers = data.get("consumerDataSet") or []
    if not isinstance(consumers, list):
        raise AclRefused("heartbeat body: consumerDataSet is not a list", _AT_PARSE)
    for consumer in consumers:
        if not isinstance(consumer, dict):
            raise AclRefused("heartbeat body: a consumerDataSet entry is not an object", _AT_PARSE)
        subs = consumer.get("subscriptionDataSet") or []
        if not isinstance(subs, list) or not all(isinstance(s, dict) for s in subs):
            raise AclRefused(
                "heartbeat body: subscriptionDataSet is not a list of objects", _AT_PARSE
            )
        found.append((_text(consumer.get("groupName")), [_text(s.get("topic")) for s in subs]))
    return found


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def java_hashmap_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a ``java.util.HashMap`` filled with ``keys`` (insertion order given).

    4.9.8 reports the *first* resource it finds missing while iterating such a map, so a request
    short of several permissions is refused naming the same one as a real broker."""
    keys = list(keys)
    capacity = 16
    while len(keys) > capacity * 0.75:
        capacity *= 2

    def bucket(key: str) -> int:
        units = key.encode("utf-16-be", "surrogatepass")
        h = 0
        for i in range(0, len(units), 2):  # String.hashCode over UTF-16 code units
            h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)  # HashMap.hash spreads the high bits

    return [k for _, _, k in sorted((bucket(k), i, k) for i, k in enumerate(keys))]


# --- validation ----------------------------------------------------------------------------------
def client_ip(remote_addr: str) -> str:
    """``host`` of ``host:port`` (4.9.8 cuts at the last colon; IPv6 brackets removed)."""
    host = remote_addr.rpartition(":")[0] if ":" in remote_addr else remote_addr
    return host.strip("[]")


class AccessValidator:
    """4.9.8's ``PlainAccessValidator`` + ``PlainPermissionManager.validate`` over one ACL file."""

    def __init__(self, config: AclConfig) -> None:
        self.config = config

    def check(self, cmd: RemotingCommand, remote_addr: str) -> None:
        """Return if ``cmd`` from ``remote_addr`` may pass; raise :class:`AclRefused` otherwise."""
        needed = needed_resources(
            cmd
        )  # parse first, as 4.9.8 (its errors refuse even white addresses)
        ip = client_ip(remote_addr)
        for _, match in self.config.global_white:
            if match(ip):
                return
        access_key = cmd.ext_fields.get(ACCESS_KEY)
        if access_key is None:
            raise AclRefused("No accessKey is configured", _AT_NO_KEY)
        account = self.config.accounts.get(access_key)
        if account is None:
            raise AclRefused(f"No acl config for {access_key}", _AT_UNKNOWN_KEY)
        if account.address_matcher(ip):
            return
        expected = calc_signature(signing_content(cmd.ext_fields, cmd.body), account.secret_key)
        if not hmac.compare_digest(
            expected.encode(), cmd.ext_fields.get(SIGNATURE, "").encode("utf-8", "replace")
        ):
            raise AclRefused(f"Check signature failed for accessKey={access_key}", _AT_SIGNATURE)
        if needed.get(RMQ_SYS_TRACE_TOPIC) == PUB:
            return  # 4.9.8 lets message-trace sends through
        self._check_perm(cmd.code, needed, account)

    @staticmethod
    def _check_perm(code: int, needed: dict[str, int], account: Account) -> None:
        if code in ADMIN_CODES and not account.admin:
            raise AclRefused(
                f"Need admin permission for request code={code}, but accessKey={account.access_key} is not",
                _AT_ADMIN,
            )
        if not needed or (not account.resource_perms and account.admin):
            return
        owned = account.resource_perms
        for resource in java_hashmap_order(needed):
            is_group = resource.startswith(RETRY_PREFIX)
            name = f"group:{resource[len(RETRY_PREFIX) :]}" if is_group else f"topic:{resource}"
            if resource not in owned:
                default = account.default_group_perm if is_group else account.default_topic_perm
                if not check_perm(needed[resource], default):
                    raise AclRefused(f"No default permission for {name}", _AT_DEFAULT_PERM)
            elif not check_perm(needed[resource], owned[resource]):
                raise AclRefused(f"No default permission for {name}", _AT_PERM)

    def refusal(self, cmd: RemotingCommand, remote_addr: str) -> RemotingCommand | None:
        """The SYSTEM_ERROR answer for a refused request, None when it may pass."""
        try:
            self.check(cmd, remote_addr)
        except AclRefused as exc:
            return cmd.error(SYSTEM_ERROR, exc.remark)
        return None


def install(broker: Broker) -> AccessValidator:
    """Check every request on ``broker``'s port against ``broker.config.acl`` (a plain_acl.yml)."""
    if broker.config.acl is None:
        raise ValueError("acl.install() needs a broker started with an ACL file (BrokerConfig.acl)")
    validator = AccessValidator(load_acl(broker.config.acl))
    log = broker.logs.broker

    def hook(cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        try:
            refused = validator.refusal(cmd, conn.remote_addr)
        except Exception as exc:  # noqa: BLE001 - a validator bug must refuse, never let a request through
            refused = cmd.error(SYSTEM_ERROR, f"{_EXCEPTION}: {exc!r}, {_AT_PARSE}")
        if refused is not None:
            log.warn(
                "RemotingExecutorThread_1",
                f"process request exception (ACL) code={cmd.code} from {conn.remote_addr}: {refused.remark}",
            )
        return refused

    broker.server.request_hook = hook
    log.info("main", validator.config.describe())
    return validator
