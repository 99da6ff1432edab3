"""transaction.log / broker.log use the real 4.9 broker's line format and message texts.

Each pattern below is checked against our broker's output *and* against the real broker's logs in
tests/data/real-broker-4.9.8, so one analyser reads both.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from rocketmq.client import Message, TransactionStatus
from txmsg_broker import codec
from txmsg_broker.message_codec import parse_offset_msg_id, properties_to_string
from txmsg_broker.rawclient import call, connect
from txmsg_broker.store import MessageStore
from txmsg_broker.testing import HEARTBEAT_GROUP, Clients, read_log, unique, wait_until

REAL_LOGS = Path(__file__).resolve().parents[1] / "data" / "real-broker-4.9.8"
LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (TRACE|DEBUG|INFO|WARN|ERROR) (\S+) - ")
HEADER = (
    r"EndTransactionRequestHeader\{producerGroup='(?P<group>[^']*)', tranStateTableOffset=\d+, "
    r"commitLogOffset=\d+, commitOrRollback=(?P<state>\d+), fromTransactionCheck=false, "
    r"msgId='(?P<msg>[0-9A-F]{32})', transactionId='(?P<tx>[0-9A-F]*)', bname='null'\} Remark: $"
)
PENDING = re.compile(
    r" WARN EndTransactionThread_\d+ - The producer\[127\.0\.0\.1:\d+\] end transaction in sending "
    r"message,  and it's pending status\.RequestHeader: " + HEADER
)
ROLLBACK = re.compile(
    r" WARN EndTransactionThread_\d+ - The producer\[127\.0\.0\.1:\d+\] end transaction in sending "
    r"message, rollback the message\.RequestHeader: " + HEADER
)
DEBUG_REQUEST = re.compile(
    r" DEBUG EndTransactionThread_\d+ - Transaction request:" + HEADER[: -len(r" Remark: $")] + "$"
)
DISCARD = re.compile(
    r" ERROR TransactionalMessageCheckService - MsgExt:MessageExt \[brokerName=null, queueId=0, .*"
    r"bornHost=/(?P<addr>[0-9.:]+), .*toString\(\)=Message\{topic='RMQ_SYS_TRANS_HALF_TOPIC', .*"
    r"PGROUP=(?P<group>[^,}]+).*\] has been checked too many times, so discard it by moving it to "
    r"system topic TRANS_CHECK_MAXTIME_TOPIC$"
)
DISCARD_PUT = re.compile(
    r" INFO TransactionalMessageCheckService - Put checked-too-many-time half message to "
    r"TRANS_CHECK_MAXTIME_TOPIC OK\. Restored in queueOffset=\d+, commitLogOffset=\d+, real topic=\S+$"
)
NEW_PRODUCER = re.compile(
    r" INFO \S+ - new producer connected, group: (?P<group>\S+) channel: ClientChannelInfo \[channel=\[id: "
    r"0x[0-9a-f]{8}, L:/127\.0\.0\.1:\d+ - R:/127\.0\.0\.1:\d+\], clientId=\S+, language=CPP, "
    r"version=333, lastUpdateTimestamp=\d+\]$"
)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def matching(pattern: re.Pattern[str], text: str) -> list[re.Match[str]]:
    return [m for m in (pattern.search(line) for line in lines(text)) if m]


def real_log(level: str, name: str) -> str:
    path = REAL_LOGS / level / name
    if not path.exists():
        pytest.fail(
            f"real broker log missing at {path}: it is tracked in git; restore it with "
            "`git checkout -- tests/data`",
            pytrace=False,
        )
    return path.read_text(errors="replace")


@pytest.mark.parametrize("pattern", [PENDING, ROLLBACK, DISCARD, DISCARD_PUT])
def test_patterns_match_the_real_broker_logs(pattern):
    assert matching(pattern, real_log("info", "transaction.log"))


def test_patterns_match_real_debug_and_broker_logs():
    assert matching(DEBUG_REQUEST, real_log("debug", "transaction.log"))
    assert matching(NEW_PRODUCER, real_log("info", "broker.log"))


def send(producer, topic: str, key: str, state: TransactionStatus) -> str:
    msg = Message(topic)
    msg.set_keys(key)
    msg.set_body(b"payload")
    return producer.send_message_in_transaction(msg, lambda m, a: state).msg_id


def test_info_level_lines_format_and_silent_commits(txmsg_broker):
    topic, group = unique("LogT"), unique("LogPG")
    checked: list[str] = []

    def checker(msg):
        uniq = msg.get_property("UNIQ_KEY")
        checked.append(uniq.decode() if isinstance(uniq, bytes) else uniq)
        return TransactionStatus.COMMIT

    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(group, checker)
        committed = send(producer, topic, "c", TransactionStatus.COMMIT)
        rolled_back = send(producer, topic, "r", TransactionStatus.ROLLBACK)
        pending = send(producer, topic, "u", TransactionStatus.UNKNOWN)
        clients.heartbeat(
            producer
        )  # check-backs need a heartbeat (the start-up one found no broker)
        wait_until(lambda: checked == [pending], timeout=15)
        # the op records of the rollback and of the check's commit are both visible to the next scans
        wait_until(lambda: "opOffset=2" in read_log(txmsg_broker.log_dir), timeout=10)
    # the check answer (COMMIT, fromTransactionCheck "1" parsed as false) is silent at INFO, like Java
    tx_log = read_log(txmsg_broker.log_dir)
    for line in lines(tx_log):
        assert LINE.match(line), line
    pend = matching(PENDING, tx_log)
    assert [(m["group"], m["msg"], m["tx"]) for m in pend] == [(group, pending, "")]
    rb = matching(ROLLBACK, tx_log)
    assert [(m["group"], m["msg"]) for m in rb] == [(group, rolled_back)]
    assert committed not in tx_log
    assert "commitOrRollback=8" not in tx_log
    assert " DEBUG " not in tx_log
    # timestamps are UTC+8 regardless of the host's zone
    stamp = LINE.match(lines(tx_log)[-1]).group(1)
    logged = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=timezone(timedelta(hours=8))
    )
    assert abs(datetime.now(UTC) - logged) < timedelta(minutes=5)
    broker_log = read_log(txmsg_broker.log_dir, "broker.log")
    for line in lines(broker_log):
        assert LINE.match(line), line
    assert [
        m["group"] for m in matching(NEW_PRODUCER, broker_log) if m["group"] != HEARTBEAT_GROUP
    ] == [group]


def test_check_answers_are_logged_like_send_phase_lines(txmsg_broker):
    """librocketmq sends fromTransactionCheck="1" -> parsed false: a check UNKNOWN is a 'sending' line
    whose transactionId is filled in (exactly what the real broker logged)."""
    topic, group = unique("LogChk"), unique("LogChkPG")
    answers = iter([TransactionStatus.UNKNOWN, TransactionStatus.ROLLBACK])
    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(group, lambda m: next(answers))
        msg_id = send(producer, topic, "k", TransactionStatus.UNKNOWN)
        clients.heartbeat(producer)
        wait_until(lambda: len(matching(ROLLBACK, read_log(txmsg_broker.log_dir))) == 1, timeout=15)
    tx_log = read_log(txmsg_broker.log_dir)
    assert [m["tx"] for m in matching(PENDING, tx_log)] == ["", msg_id]
    assert [m["tx"] for m in matching(ROLLBACK, tx_log)] == [msg_id]
    assert "Check producer[" not in tx_log


def test_debug_level_shows_commits_and_discards(txmsg_broker_factory):
    broker = txmsg_broker_factory(transaction_log_level="DEBUG", check_max=1)
    topic, group = unique("LogDbg"), unique("LogDbgPG")
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(group, lambda m: TransactionStatus.UNKNOWN)
        committed = send(producer, topic, "c", TransactionStatus.COMMIT)
        stuck = send(producer, topic, "u", TransactionStatus.UNKNOWN)
        wait_until(lambda: matching(DISCARD_PUT, read_log(broker.log_dir)), timeout=15)
    tx_log = read_log(broker.log_dir)
    requests = matching(DEBUG_REQUEST, tx_log)
    assert (group, "8", committed) in [(m["group"], m["state"], m["msg"]) for m in requests]
    assert "Transaction op message write successfully." in tx_log
    assert f"realMsgId={stuck}" in tx_log  # "Send check message" line
    (discard,) = matching(DISCARD, tx_log)
    assert discard["group"] == group
    assert "TRANSACTION_CHECK_TIMES=1" in discard.group(0)


def test_java_style_check_answers_and_bad_end_transaction(txmsg_broker):
    """A Java client sends fromTransactionCheck="true": then the 'Check producer[...]' texts are used.
    END_TRANSACTION with offsets that do not match the half message changes nothing."""
    group, topic = unique("JavaPG"), unique("JavaT")

    def half(key: str) -> tuple[str, str]:
        props = {"UNIQ_KEY": key, "TRAN_MSG": "true", "PGROUP": group, "WAIT": "true"}
        ext = {
            "a": group,
            "b": topic,
            "c": "TBW102",
            "d": 4,
            "e": 0,
            "f": 4,
            "g": "1",
            "h": 0,
            "i": properties_to_string(props),
            "j": "0",
            "k": "0",
            "l": 16,
            "m": "0",
        }
        response = call(txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, ext, b"j")
        assert response.code == codec.SUCCESS
        return response.ext_fields["msgId"], response.ext_fields["queueOffset"]

    def end(msg_id: str, queue_offset: str, key: str, state: int) -> None:
        _, clo = parse_offset_msg_id(msg_id)
        ext = {
            "producerGroup": group,
            "tranStateTableOffset": queue_offset,
            "commitLogOffset": clo,
            "commitOrRollback": state,
            "fromTransactionCheck": "true",
            "msgId": key,
            "transactionId": key,
        }
        with connect(txmsg_broker.broker_addr) as sock:
            sock.sendall(
                codec.RemotingCommand.request(codec.END_TRANSACTION, ext, oneway=True).encode()
            )

    key_commit = "A" * 32
    msg_id, qoff = half(key_commit)
    end(msg_id, str(int(qoff) + 7), key_commit, 8)  # wrong tranStateTableOffset: refused
    end(msg_id, qoff, key_commit, 8)
    key_rb = "B" * 32
    end(*half(key_rb), key_rb, 12)
    key_u = "C" * 32
    end(*half(key_u), key_u, 0)
    log = lambda: read_log(txmsg_broker.log_dir)  # noqa: E731
    markers = (
        "but it's pending status",
        "the producer commit the message",
        "the producer rollback",
    )
    wait_until(lambda: all(m in log() for m in markers), timeout=10)
    text = log()
    assert "Check producer[127.0.0.1:" in text
    assert "transaction state, the producer commit the message.RequestHeader: " in text
    assert f"msgId='{key_rb}'" in text
    assert "the producer rollback the message" in text
    assert "fromTransactionCheck=true" in text
    assert "The transaction state table offset wrong" in read_log(
        txmsg_broker.log_dir, "broker.log"
    )
    txmsg_broker.stop()
    with MessageStore(txmsg_broker.data_dir) as store:
        committed = [m.properties["UNIQ_KEY"] for q in range(4) for m in store.get(topic, q, 0, 10)]
    assert committed == [key_commit]  # exactly once despite the refused request
