"""RocketMQ 5 topic types: ``txmsg topic create NAME --type ...`` and enforcement on send."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from rocketmq.client import Message, SendStatus, TransactionStatus
from rocketmq.exceptions import RocketMQException
from txmsg_broker import codec, fastjson
from txmsg_broker.cli import topic as topic_cli
from txmsg_broker.message_codec import properties_to_string
from txmsg_broker.rawclient import call
from txmsg_broker.testing import Clients, read_log, unique


def create(namesrv: str, name: str, kind: str | None) -> None:
    args = ["create", name, "--namesrv", namesrv] + (["--type", kind] if kind else [])
    result = CliRunner().invoke(topic_cli, args)
    assert result.exit_code == 0, result.output
    assert "success" in result.output


def plain(producer, topic: str) -> None:
    msg = Message(topic)
    msg.set_body(b"plain")
    assert producer.send_sync(msg).status == SendStatus.OK


def transactional(producer, topic: str) -> None:
    msg = Message(topic)
    msg.set_body(b"tx")
    producer.send_message_in_transaction(msg, lambda m, a: TransactionStatus.COMMIT)


def rejected(fn, *args) -> bool:
    try:
        fn(*args)
    except RocketMQException:
        return True
    return False


def raw_send(addr: str, topic: str, transactional_msg: bool) -> codec.RemotingCommand:
    props = {"UNIQ_KEY": unique("K"), "WAIT": "true"}
    if transactional_msg:
        props.update({"TRAN_MSG": "true", "PGROUP": "RawPG"})
    ext = {
        "a": "RawPG",
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 4 if transactional_msg else 0,
        "g": "1",
        "h": 0,
        "i": properties_to_string(props),
        "j": "0",
        "k": "0",
        "l": 16,
        "m": "0",
    }
    return call(addr, codec.SEND_MESSAGE_V2, ext, b"raw")


def test_typed_topics_reject_the_other_kind(txmsg_broker):
    normal, tx_topic = unique("NormalT"), unique("TxT")
    create(txmsg_broker.namesrv_addr, normal, "NORMAL")
    create(txmsg_broker.namesrv_addr, tx_topic, "TRANSACTION")
    route = call(txmsg_broker.namesrv_addr, codec.GET_ROUTEINFO_BY_TOPIC, {"topic": tx_topic})
    assert route.code == codec.SUCCESS
    assert fastjson.loads(route.body)["queueDatas"][0]["writeQueueNums"] == 4

    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.producer()
        tx_producer = clients.transaction_producer(
            unique("TypesPG"), lambda m: TransactionStatus.COMMIT
        )
        plain(producer, normal)
        transactional(tx_producer, tx_topic)
        assert rejected(transactional, tx_producer, normal)
        assert rejected(plain, producer, tx_topic)

    log = read_log(txmsg_broker.log_dir, "broker.log")
    assert f"topic {normal} (message.type=NORMAL): transactional messages are rejected" in log
    assert f"topic {tx_topic} (message.type=TRANSACTION): plain messages are rejected" in log

    response = raw_send(txmsg_broker.broker_addr, normal, transactional_msg=True)
    assert response.code == codec.MESSAGE_ILLEGAL
    assert f"txmsg topic create {normal} --type TRANSACTION" in (response.remark or "")
    assert (
        raw_send(txmsg_broker.broker_addr, tx_topic, transactional_msg=False).code
        == codec.MESSAGE_ILLEGAL
    )
    assert (
        raw_send(txmsg_broker.broker_addr, tx_topic, transactional_msg=True).code == codec.SUCCESS
    )


def test_untyped_topics_accept_both_kinds(txmsg_broker):
    topic = unique("AnyT")
    create(txmsg_broker.namesrv_addr, topic, None)
    assert raw_send(txmsg_broker.broker_addr, topic, transactional_msg=True).code == codec.SUCCESS
    assert raw_send(txmsg_broker.broker_addr, topic, transactional_msg=False).code == codec.SUCCESS


def test_enforcement_can_be_switched_off(txmsg_broker_factory):
    broker = txmsg_broker_factory(enforce_topic_types=False)
    normal = unique("LooseT")
    create(broker.namesrv_addr, normal, "NORMAL")
    assert raw_send(broker.broker_addr, normal, transactional_msg=True).code == codec.SUCCESS


def test_topic_create_errors_are_clear(txmsg_broker):
    runner = CliRunner()
    bad_type = runner.invoke(
        topic_cli, ["create", "X", "--type", "WEIRD", "--namesrv", txmsg_broker.namesrv_addr]
    )
    assert bad_type.exit_code != 0
    assert "WEIRD" in bad_type.output
    bad_name = runner.invoke(
        topic_cli, ["create", "bad name", "--namesrv", txmsg_broker.namesrv_addr]
    )
    assert bad_name.exit_code != 0
    assert "illegal characters" in bad_name.output
    system = runner.invoke(
        topic_cli, ["create", "RMQ_SYS_TRANS_HALF_TOPIC", "--namesrv", txmsg_broker.namesrv_addr]
    )
    assert system.exit_code != 0
    assert "system topic" in system.output


@pytest.mark.parametrize("addr", ["127.0.0.1:1"])
def test_topic_create_reports_unreachable_name_server(addr):
    result = CliRunner().invoke(topic_cli, ["create", "T", "--namesrv", addr])
    assert result.exit_code != 0
    assert "cannot reach the name server" in result.output
