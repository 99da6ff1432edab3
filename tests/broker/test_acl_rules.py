"""ACL rules without a broker: plain_acl.yml loading (and its startup errors), address patterns, the
signature, the request-code table and the order of 4.9.8's checks (``txmsg_broker.acl``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from txmsg_broker.acl import (
    AccessValidator,
    calc_signature,
    java_hashmap_order,
    needed_resources,
    sign_request,
    signing_content,
)
from txmsg_broker.acl_config import (
    PUB,
    SUB,
    AclConfigError,
    address_matcher,
    load_acl,
    parse_acl,
    write_acl,
)
from txmsg_broker.cli import broker as broker_command
from txmsg_broker.codec import (
    END_TRANSACTION,
    HEART_BEAT,
    PULL_MESSAGE,
    SEND_MESSAGE_V2,
    UNREGISTER_CLIENT,
    UPDATE_AND_CREATE_TOPIC,
    UPDATE_CONSUMER_OFFSET,
    RemotingCommand,
)

ACL: dict[str, Any] = {
    "globalWhiteRemoteAddresses": ["10.10.103.*", "192.168.0.*"],
    "accounts": [
        {
            "accessKey": "RocketMQ",
            "secretKey": 12345678,  # a YAML number, as in 4.9.8's sample file
            "whiteRemoteAddress": None,
            "admin": False,
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "SUB",
            "topicPerms": ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"],
            "groupPerms": ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"],
        },
        {
            "accessKey": "rocketmq2",
            "secretKey": 12345678,
            "whiteRemoteAddress": "192.168.1.*",
            "admin": True,
        },
    ],
}
PREFIX = "org.apache.rocketmq.acl.common.AclException: "
AT_VALIDATE = (
    "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java:"
)
AT_CHECK = (
    "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java:"
)


@pytest.fixture
def validator() -> AccessValidator:
    return AccessValidator(parse_acl(json.loads(json.dumps(ACL))))


def send(topic: str, group: str = "PG", body: bytes = b"hello") -> RemotingCommand:
    return RemotingCommand.request(
        SEND_MESSAGE_V2,
        {"a": group, "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1},
        body,
    )


def refusal(
    validator: AccessValidator, cmd: RemotingCommand, addr: str = "127.0.0.1:5000"
) -> str | None:
    answer = validator.refusal(cmd, addr)
    if answer is None:
        return None
    assert answer.code == 1  # 4.9.8 answers every AclException as SYSTEM_ERROR
    return answer.remark


# --- the signature ---------------------------------------------------------------------------------
def test_signature_is_hmac_sha1_over_sorted_values_then_body() -> None:
    ext = {
        "b": "T",
        "a": "G",
        "AccessKey": "RocketMQ",
        "OnsChannel": "ALIYUN",
        "Signature": "x",
        "_UNIQUE_KEY_QUERY": "true",
    }
    content = signing_content(ext, b"BODY")
    # key order: AccessKey, OnsChannel, a, b (Signature and _UNIQUE_KEY_QUERY left out)
    assert content == b"RocketMQALIYUNGTBODY"
    expected = base64.b64encode(hmac.new(b"12345678", content, hashlib.sha1).digest()).decode()
    assert calc_signature(content, "12345678") == expected


def test_a_signed_request_passes_and_any_change_breaks_it(validator: AccessValidator) -> None:
    cmd = sign_request(send("topicB"), "RocketMQ", "12345678")
    assert refusal(validator, cmd) is None
    for change in ("body", "field", "key"):
        copy = RemotingCommand.decode(cmd.encode()[4:])
        if change == "body":
            copy.body += b"!"
        elif change == "field":
            copy.ext_fields["b"] = "topicC"
        else:
            copy.ext_fields["Signature"] = calc_signature(b"x", "12345678")
        assert refusal(validator, copy) == (
            f"{PREFIX}Check signature failed for accessKey=RocketMQ, {AT_VALIDATE}684)"
        )


# --- 4.9.8's order of checks ------------------------------------------------------------------------
def test_refusal_remarks_are_4_9_8s(validator: AccessValidator) -> None:
    assert (
        refusal(validator, send("topicB"))
        == f"{PREFIX}No accessKey is configured, {AT_VALIDATE}664)"
    )
    unsigned_cpp = send("topicB")
    unsigned_cpp.ext_fields["AccessKey"] = ""  # librocketmq without credentials
    assert refusal(validator, unsigned_cpp) == f"{PREFIX}No acl config for , {AT_VALIDATE}668)"
    assert refusal(validator, sign_request(send("topicB"), "nobody-here", "12345678")) == (
        f"{PREFIX}No acl config for nobody-here, {AT_VALIDATE}668)"
    )
    assert refusal(validator, sign_request(send("topicB"), "RocketMQ", "wrong-secret")) == (
        f"{PREFIX}Check signature failed for accessKey=RocketMQ, {AT_VALIDATE}684)"
    )
    # a topic with an explicit DENY, and one only the default (DENY) covers
    assert refusal(validator, sign_request(send("topicA"), "RocketMQ", "12345678")) == (
        f"{PREFIX}No default permission for topic:topicA, {AT_CHECK}611)"
    )
    assert refusal(validator, sign_request(send("other"), "RocketMQ", "12345678")) == (
        f"{PREFIX}No default permission for topic:other, {AT_CHECK}606)"
    )
    create = RemotingCommand.request(UPDATE_AND_CREATE_TOPIC, {"topic": "t"})
    assert refusal(validator, sign_request(create, "RocketMQ", "12345678")) == (
        f"{PREFIX}Need admin permission for request code=17, but accessKey=RocketMQ is not, {AT_CHECK}581)"
    )
    assert refusal(validator, sign_request(create, "rocketmq2", "12345678")) is None


def test_white_addresses(validator: AccessValidator) -> None:
    assert (
        refusal(validator, send("anything"), "10.10.103.7:4000") is None
    )  # global: no keys at all
    assert refusal(validator, send("anything"), "10.10.104.7:4000") is not None
    # the account's own white address: no signature needed, and admin
    unsigned = send("anything")
    unsigned.ext_fields["AccessKey"] = "rocketmq2"
    assert refusal(validator, unsigned, "192.168.1.20:4000") is None
    assert "Check signature failed" in (refusal(validator, unsigned, "192.168.2.20:4000") or "")


def test_group_permissions_and_the_request_code_table(validator: AccessValidator) -> None:
    def pull(group: str, topic: str = "topicC") -> RemotingCommand:
        cmd = RemotingCommand.request(
            PULL_MESSAGE, {"consumerGroup": group, "topic": topic, "queueId": 0}
        )
        return sign_request(cmd, "RocketMQ", "12345678")

    assert refusal(validator, pull("groupC")) is None
    assert refusal(validator, pull("anyGroup")) is None  # defaultGroupPerm SUB
    assert (
        refusal(validator, pull("groupA"))
        == f"{PREFIX}No default permission for group:groupA, {AT_CHECK}611)"
    )
    assert refusal(validator, pull("groupC", "topicA")) is not None
    # sends to %RETRY% topics need SUB on the group (a consumer's re-send), not PUB on the topic
    assert needed_resources(send("%RETRY%groupC", "groupC")) == {"%RETRY%groupC": SUB}
    assert needed_resources(send("topicB")) == {"topicB": PUB}
    heartbeat = RemotingCommand.request(
        HEART_BEAT,
        body=json.dumps(
            {
                "clientID": "c",
                "producerDataSet": [{"groupName": "PG"}],
                "consumerDataSet": [
                    {
                        "groupName": "groupC",
                        "subscriptionDataSet": [{"topic": "topicC"}, {"topic": "x"}],
                    }
                ],
            }
        ).encode(),
    )
    assert needed_resources(heartbeat) == {"%RETRY%groupC": SUB, "topicC": SUB, "x": SUB}
    offset = RemotingCommand.request(UPDATE_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "t"})
    assert needed_resources(offset) == {"%RETRY%g": SUB, "t": SUB}
    # a producer's unregister names consumerGroup "" (librocketmq): 4.9.8 checks group ""
    assert needed_resources(RemotingCommand.request(UNREGISTER_CLIENT, {"consumerGroup": ""})) == {
        "%RETRY%": SUB
    }
    # END_TRANSACTION needs a valid signature only
    end = RemotingCommand.request(
        END_TRANSACTION, {"producerGroup": "PG", "commitOrRollback": "8"}, oneway=True
    )
    assert needed_resources(end) == {}
    assert "No accessKey" in (refusal(validator, end) or "")
    assert refusal(validator, sign_request(end, "RocketMQ", "12345678")) is None


def test_an_unreadable_heartbeat_is_refused_even_from_a_white_address(
    validator: AccessValidator,
) -> None:
    bad = RemotingCommand.request(HEART_BEAT, body=b"{not json")
    remark = refusal(validator, bad, "10.10.103.1:1") or ""
    assert remark.startswith(PREFIX + "heartbeat body is not HeartbeatData JSON")
    assert remark.endswith("PlainAccessValidator.parse(PlainAccessValidator.java:134)")


def test_first_missing_resource_in_java_hashmap_order() -> None:
    assert java_hashmap_order(["c", "b", "a"]) == ["a", "b", "c"]  # buckets 97, 98, 99 (mod 16)
    assert java_hashmap_order(["BB", "Aa"]) == [
        "BB",
        "Aa",
    ]  # equal String.hashCode: insertion order
    keys = [f"topic{i}" for i in range(20)]  # > 12 keys: the table has grown to 32 buckets
    order = java_hashmap_order(keys)
    assert sorted(order) == sorted(keys)
    assert order != keys


# --- plain_acl.yml -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1", "10.0.0.1"]),
        ("192.168.*.*", ["192.168.77.1"], ["192.169.0.1"]),
        ("10.10.103.1-50", ["10.10.103.1", "10.10.103.50"], ["10.10.103.51", "10.10.104.2"]),
        ("127.0.0.1,127.0.0.2", ["127.0.0.2"], ["127.0.0.3"]),
        ("192.168.1.{1,2,3}", ["192.168.1.3"], ["192.168.1.4"]),
        ("*", ["1.2.3.4", "::1"], []),
        ("", [], ["127.0.0.1"]),
        ("::1", ["0:0:0:0:0:0:0:1"], ["::2"]),
        ("fe80:0:0:0:0:0:0:*", ["fe80::1"], ["fe81::1"]),
    ],
)
def test_address_patterns(pattern: str, inside: list[str], outside: list[str]) -> None:
    match = address_matcher(pattern)
    assert all(match(ip) for ip in inside)
    assert not any(match(ip) for ip in outside)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("accounts: [\n  - accessKey: x\n", "is not valid YAML"),
        ("", "every request would be refused"),
        ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "longer than 6 characters"),
        (
            "accounts:\n  - accessKey: longenough\n    secretKey: 12345678\n    topicPerm: [a=PUB]\n",
            "unknown key(s) topicPerm",
        ),
        (
            "accounts:\n  - accessKey: longenough\n    secretKey: 12345678\n    topicPerms: [a=PUBLISH]\n",
            "unknown permission 'PUBLISH'",
        ),
        (
            "accounts:\n  - accessKey: longenough\n    secretKey: 12345678\n    groupPerms: [justaname]\n",
            "the expected format is 'name=PERM'",
        ),
        ("globalWhiteRemoteAddresses: [300.1.*.*]\n", "is not an address pattern"),
        (
            "accounts:\n  - accessKey: longenough\n    secretKey: 12345678\n    whiteRemoteAddress: 1.2.3\n",
            "is not an address pattern",
        ),
        ("acounts: []\n", "unknown key(s) acounts"),
    ],
)
def test_a_malformed_acl_file_is_a_clear_startup_error(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(content)
    with pytest.raises(AclConfigError, match="the ACL file") as info:
        load_acl(path)
    assert message in str(info.value)
    assert "12345678" not in str(info.value)  # secrets never appear in errors
    result = CliRunner().invoke(
        broker_command,
        [
            "--acl",
            str(path),
            "--namesrv-port",
            "0",
            "--broker-port",
            "0",
            "--data-dir",
            str(tmp_path / "d"),
            "--log-dir",
            str(tmp_path / "l"),
        ],
    )
    assert result.exit_code == 2, result.output  # a usage error, before anything listens
    assert message in result.output
    assert "Traceback" not in result.output


def test_missing_file_and_grpc_combination(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(broker_command, ["--acl", str(tmp_path / "nope.yml")])
    assert result.exit_code == 2
    assert "cannot read the ACL file" in result.output
    good = write_acl(tmp_path / "acl.yml", ACL)
    result = runner.invoke(broker_command, ["--acl", str(good), "--grpc-port", "0"])
    assert result.exit_code == 2
    assert "Leave out --grpc-port" in result.output


def test_the_first_of_repeated_access_keys_wins(tmp_path: Path) -> None:
    data = {
        "accounts": [
            {"accessKey": "twice-key", "secretKey": "first-secret", "admin": True},
            {"accessKey": "twice-key", "secretKey": "second-secret"},
        ]
    }
    config = load_acl(write_acl(tmp_path / "acl.yml", data))
    assert config.accounts["twice-key"].secret_key == "first-secret"  # noqa: S105 - test data
    assert "first-secret" not in repr(config.accounts["twice-key"])
