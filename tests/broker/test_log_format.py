"""``txmsg broker --log-format 4|5``: the same remoting run logged as a 4.9.8 or a 5.1+ broker logs it.

Why: the health job reads both formats (``spark/txmsg_health/patterns.py``), and its 5.x path should be
testable on logs of live remoting runs, not only on gRPC traffic. The check here is the job's own
reading of a line, in Python: its header cut, its quote test for the version, and its 5.x
check-back marker.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from rocketmq.client import Message, TransactionStatus
from txmsg_broker.app import BrokerProcess
from txmsg_broker.config import BrokerConfig
from txmsg_broker.pytest_plugin import BrokerFactory
from txmsg_broker.testing import Clients, read_log, unique, wait_until
from txmsg_health import patterns

#: the 5.x per-check-back INFO line's marker (``patterns.CHECK_SENT_MARK`` where the job has it)
CHECK_SENT_MARK = getattr(patterns, "CHECK_SENT_MARK", "Check transaction. real_topic=")


def header_version(line: str) -> str:
    """How the health job reads a header line (``patterns.stage2``): cut after ``HEADER`` up to the
    closing brace, split at commas, every field name in ``HEADER_FIELDS`` order (4.9.5+ adds a
    trailing `` bname=``); ``4.9`` when the group is quoted, else ``5``.  A header the job could
    not read fails the test."""
    assert patterns.HEADER in line, f"no EndTransactionRequestHeader in: {line}"
    rest = line.split(patterns.HEADER, 1)[1]
    assert "}" in rest, f"the header is cut off: {line}"
    fields = rest.split("}", 1)[0].split(",")
    names = patterns.HEADER_FIELDS
    assert len(fields) >= len(names), line
    assert all(f.startswith(n) for f, n in zip(fields, names, strict=False)), line
    return "4.9" if fields[0][len("producerGroup=") :].startswith("'") else "5"


def run_transactions(namesrv: str, log_dir: object) -> tuple[str, str, str]:
    """One rollback at send time, one UNKNOWN whose check-backs are answered UNKNOWN then ROLLBACK;
    returns once the broker logged the ROLLBACK answer."""
    topic, group = unique("LogFmtT"), unique("LogFmtPG")
    answers = iter([TransactionStatus.UNKNOWN, TransactionStatus.ROLLBACK])

    def send(producer: Any, key: str, state: TransactionStatus) -> str:
        msg = Message(topic)
        msg.set_keys(key)
        msg.set_body(b"payload")
        return str(producer.send_message_in_transaction(msg, lambda m, a: state).msg_id)

    with Clients(namesrv) as clients:
        producer = clients.transaction_producer(
            group, lambda m: next(answers, TransactionStatus.ROLLBACK)
        )
        rolled_back = send(producer, "r", TransactionStatus.ROLLBACK)
        pending = send(producer, "u", TransactionStatus.UNKNOWN)
        clients.heartbeat(producer)  # check-backs need a heartbeat
        wait_until(
            lambda: read_log(log_dir).count("rollback the message") >= 2,
            timeout=30,
            message=lambda: read_log(log_dir),
        )
        return group, rolled_back, pending


@pytest.mark.parametrize(("log_format", "version"), [(4, "4.9"), (5, "5")])
def test_remoting_lines_in_the_chosen_format(
    txmsg_broker_factory: BrokerFactory, log_format: int, version: str
) -> None:
    broker = txmsg_broker_factory(log_format=log_format)
    group, rolled_back, pending = run_transactions(broker.namesrv_addr, broker.log_dir)
    log = read_log(broker.log_dir)
    headers = [line for line in log.splitlines() if patterns.HEADER in line]
    assert len(headers) >= 3, log  # send-time rollback, send-time pending, check answers
    assert {header_version(line) for line in headers} == {version}
    assert any(
        f"msgId={rolled_back}" in line or f"msgId='{rolled_back}'" in line for line in headers
    )
    checks = [line for line in log.splitlines() if CHECK_SENT_MARK in line]
    if log_format == 5:
        assert all("bname" not in line for line in headers)
        assert f"producerGroup={group}, " in headers[0]
        # one INFO line per check-back, by the check thread, with the uniqKey the job joins on
        assert len(checks) >= 2, log
        for line in checks:
            assert " INFO Transaction-msg-check-thread - " in line
        uniq = re.search(getattr(patterns, "RX_UNIQ_KEY", r"uniqKey=([^,]+)"), checks[0])
        assert uniq is not None
        assert uniq.group(1) == pending
    else:
        assert all(line.endswith("bname='null'} Remark: ") for line in headers if " WARN " in line)
        assert checks == []  # 4.9 logs check-backs at DEBUG only


def test_log_format_is_validated_and_passed_to_the_command() -> None:
    assert BrokerConfig(log_format=5).log_format == 5
    assert BrokerConfig(log_format="5").log_format == 5  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log_format must be 4"):
        BrokerConfig(log_format=6)
    command = BrokerProcess("d", "l", log_format=5).command()
    assert command[command.index("--log-format") + 1] == "5"
