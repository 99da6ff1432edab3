"""ACL end to end with the real client (librocketmq 2.1.0) and raw remoting clients against a broker
started with ``acl=`` (a plain_acl.yml): the right keys pass, a wrong secret, no credentials, no
permission on the topic or the group and a non-whitelisted address are refused with 4.9.8's answer
(SYSTEM_ERROR 1 and the AclException remark), and a refused send stores nothing."""

from __future__ import annotations

from typing import Any

import pytest
from txmsg_broker.acl_config import write_acl
from txmsg_broker.app import BrokerProcess
from txmsg_broker.codec import (
    GET_MAX_OFFSET,
    PULL_MESSAGE,
    SEND_MESSAGE_V2,
    SUCCESS,
    SYSTEM_ERROR,
    UPDATE_AND_CREATE_TOPIC,
)
from txmsg_broker.pytest_plugin import TEST_SETTINGS
from txmsg_broker.rawclient import call
from txmsg_broker.testing import Clients, create_topic, read_log, unique, wait_until

ADMIN = ("txmsg-admin", "admin-secret-1")
APP = ("txmsg-app-1", "app-secret-1")
TOPIC = "AclOrders"
DENIED_TOPIC = "AclSecret"
DENIED_GROUP = "AclBlockedCG"
PREFIX = "org.apache.rocketmq.acl.common.AclException: "
AT = "org.apache.rocketmq.acl.plain.PlainPermissionManager."

ACL: dict[str, Any] = {
    "accounts": [
        {"accessKey": ADMIN[0], "secretKey": ADMIN[1], "admin": True},
        {
            "accessKey": APP[0],
            "secretKey": APP[1],
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "SUB",
            "topicPerms": [f"{TOPIC}=PUB|SUB", f"{DENIED_TOPIC}=DENY"],
            "groupPerms": [f"{DENIED_GROUP}=DENY"],
        },
    ],
}


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("acl-broker")
    acl = write_acl(base / "plain_acl.yml", ACL)
    proc = BrokerProcess(base / "data", base / "logs", acl=acl, **TEST_SETTINGS).start()
    for topic in (TOPIC, DENIED_TOPIC):
        create_topic(proc.namesrv_addr, topic, credentials=ADMIN)
    yield proc
    proc.stop()


def send_header(topic: str, group: str = "AclRawPG") -> dict[str, Any]:
    return {
        "a": group,
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": 1,
        "h": 0,
        "i": "KEYS\x01k\x02",
        "j": 0,
        "k": "false",
        "l": 16,
        "m": "false",
    }


def stored(broker: Any, topic: str) -> int:
    """Messages in ``topic`` (sum of the queues' max offsets), asked with the admin's keys."""
    total = 0
    for queue_id in range(4):
        answer = call(
            broker.broker_addr,
            GET_MAX_OFFSET,
            {"topic": topic, "queueId": queue_id},
            credentials=ADMIN,
        )
        assert answer.code == SUCCESS, answer.remark
        total += int(answer.ext("offset"))
    return total


def acl_lines(broker: Any, text: str) -> list[str]:
    return [
        line
        for line in read_log(broker.log_dir, "broker.log").splitlines()
        if "(ACL)" in line and text in line
    ]


# --- raw clients: the exact answers --------------------------------------------------------------
def test_raw_answers_are_4_9_8s(acl_broker: Any) -> None:
    addr = acl_broker.broker_addr
    before = stored(acl_broker, TOPIC)
    cases = [
        (
            None,
            TOPIC,
            f"{PREFIX}No accessKey is configured, {AT}validate(PlainPermissionManager.java:664)",
        ),
        (
            ("someone-else", APP[1]),
            TOPIC,
            f"{PREFIX}No acl config for someone-else, {AT}validate(PlainPermissionManager.java:668)",
        ),
        (
            (APP[0], "wrong-secret"),
            TOPIC,
            f"{PREFIX}Check signature failed for accessKey={APP[0]}, {AT}validate(PlainPermissionManager.java:684)",
        ),
        (
            APP,
            DENIED_TOPIC,
            f"{PREFIX}No default permission for topic:{DENIED_TOPIC}, {AT}checkPerm(PlainPermissionManager.java:611)",
        ),
        (
            APP,
            "AclNotListed",
            f"{PREFIX}No default permission for topic:AclNotListed, {AT}checkPerm(PlainPermissionManager.java:606)",
        ),
    ]
    for credentials, topic, remark in cases:
        answer = call(
            addr, SEND_MESSAGE_V2, send_header(topic), b"refused", credentials=credentials
        )
        assert (answer.code, answer.remark) == (SYSTEM_ERROR, remark)
    assert stored(acl_broker, TOPIC) == before  # nothing of the refused sends was stored
    assert stored(acl_broker, DENIED_TOPIC) == 0
    assert call(addr, SEND_MESSAGE_V2, send_header(TOPIC), b"ok", credentials=APP).code == SUCCESS
    assert stored(acl_broker, TOPIC) == before + 1

    pull = {
        "consumerGroup": DENIED_GROUP,
        "topic": TOPIC,
        "queueId": 0,
        "queueOffset": 0,
        "maxMsgNums": 1,
        "sysFlag": 0,
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "subVersion": 0,
    }
    answer = call(addr, PULL_MESSAGE, pull, credentials=APP)
    assert (answer.code, answer.remark) == (
        SYSTEM_ERROR,
        f"{PREFIX}No default permission for group:{DENIED_GROUP}, {AT}checkPerm(PlainPermissionManager.java:611)",
    )
    create = {"topic": unique("AclNew"), "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
    answer = call(addr, UPDATE_AND_CREATE_TOPIC, create, credentials=APP)
    assert answer.remark == (
        f"{PREFIX}Need admin permission for request code=17, but accessKey={APP[0]} is not, "
        f"{AT}checkPerm(PlainPermissionManager.java:581)"
    )
    assert (
        call(acl_broker.namesrv_addr, 105, {"topic": TOPIC}).code == SUCCESS
    )  # the name server checks nothing
    assert acl_lines(acl_broker, "Check signature failed")  # broker.log says why


# --- the real client -----------------------------------------------------------------------------
def _send(clients: Clients, topic: str, body: bytes) -> str | None:
    """The send's error text, None when it succeeded."""
    from rocketmq.client import Message  # noqa: PLC0415 - the real client, only where it is used

    producer = clients.producer(unique("AclPG"))
    msg = Message(topic)
    msg.set_keys("k")
    msg.set_body(body)
    try:
        producer.send_sync(msg)
    except Exception as exc:  # noqa: BLE001 - the wrapper raises its own exception types
        return str(exc)
    return None


def test_real_client_with_the_right_keys_sends_and_consumes(acl_broker: Any) -> None:
    with Clients(acl_broker.namesrv_addr, credentials=APP) as clients:
        received = clients.consumer(unique("AclCG"), TOPIC)
        body = unique("acl-ok").encode()
        assert _send(clients, TOPIC, body) is None
        wait_until(
            lambda: any(r.body == body for r in received), timeout=30, message="the signed message"
        )


@pytest.mark.parametrize(
    ("credentials", "topic", "reason"),
    [
        ((APP[0], "wrong-secret"), TOPIC, f"Check signature failed for accessKey={APP[0]}"),
        # librocketmq without credentials still signs, with AccessKey "" (its default)
        (None, TOPIC, "No acl config for ,"),
        (APP, DENIED_TOPIC, f"No default permission for topic:{DENIED_TOPIC}"),
    ],
)
def test_real_client_refused_sends_store_nothing(
    acl_broker: Any, credentials: tuple[str, str] | None, topic: str, reason: str
) -> None:
    before = stored(acl_broker, topic)
    with Clients(acl_broker.namesrv_addr, credentials=credentials) as clients:
        body = unique("acl-refused").encode()
        error = _send(clients, topic, body)
    # librocketmq retries, then reports only "No route info"; broker.log has the real answer
    assert error is not None
    assert "No route info" in error
    lines = acl_lines(acl_broker, reason)
    assert any("code=310" in line for line in lines), reason
    assert stored(acl_broker, topic) == before


def test_real_consumer_of_a_denied_group_gets_nothing(acl_broker: Any) -> None:
    with Clients(acl_broker.namesrv_addr, credentials=APP) as clients:
        received = clients.consumer(DENIED_GROUP, TOPIC)
        assert _send(clients, TOPIC, unique("acl-for-nobody").encode()) is None
        wait_until(
            lambda: acl_lines(acl_broker, f"No default permission for group:{DENIED_GROUP}"),
            timeout=30,
            message="the refused heartbeat/pull of the denied group",
        )
    assert received == []


def test_white_addresses_on_loopback(txmsg_broker_factory: Any) -> None:
    """A global white address needs no keys; a pattern that does not cover 127.0.0.1 refuses."""
    open_broker = txmsg_broker_factory(acl={"globalWhiteRemoteAddresses": ["127.0.0.1"], **ACL})
    closed = txmsg_broker_factory(acl={"globalWhiteRemoteAddresses": ["10.10.103.*"], **ACL})
    for broker, expected in ((open_broker, SUCCESS), (closed, SYSTEM_ERROR)):
        create_topic(broker.namesrv_addr, TOPIC, credentials=ADMIN)
        answer = call(broker.broker_addr, SEND_MESSAGE_V2, send_header(TOPIC), b"unsigned")
        assert answer.code == expected, answer.remark
    assert stored(closed, TOPIC) == 0
    assert stored(open_broker, TOPIC) == 1
    # an account's own whiteRemoteAddress lets its requests in without a (valid) signature
    own = txmsg_broker_factory(
        acl={
            "accounts": [
                {**ACL["accounts"][1], "whiteRemoteAddress": "127.0.0.*"},
                ACL["accounts"][0],
            ]
        }
    )
    create_topic(own.namesrv_addr, TOPIC, credentials=ADMIN)
    answer = call(
        own.broker_addr,
        SEND_MESSAGE_V2,
        send_header(TOPIC),
        b"x",
        credentials=(APP[0], "not-the-secret"),
    )
    assert answer.code == SUCCESS
