"""Issue 14 points 1-2: the transaction outcome table through txmsg on the rocketmq5 backend, and
exceptions mapped as on the rocketmq backend (embedded broker: check interval 1 s, 3 checks at most).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest
from txmsg_broker.testing import Clients, create_topic, read_log, unique, wait_until

from txmsg import (
    InvalidMessageError,
    InvalidNameError,
    ListenerDefinitionError,
    ListenerRegistry,
    LocalTransactionState,
    Message,
    ProducerClosedError,
    SendError,
)
from txmsg.config import load_config

S = LocalTransactionState
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"

#: row -> (execute_local's answer or an exception, check_local's successive answers)
TABLE: dict[str, tuple[Any, list[Any]]] = {
    "COMMIT": (S.COMMIT, []),
    "ROLLBACK": (S.ROLLBACK, []),
    "U_COMMIT": (S.UNKNOW, [S.COMMIT]),
    "U_ROLLBACK": (S.UNKNOW, [S.ROLLBACK]),
    "UU_COMMIT": (S.UNKNOW, [S.UNKNOW, S.COMMIT]),
    "U_FOREVER": (S.UNKNOW, [S.UNKNOW]),
    "RAISE_COMMIT": (RuntimeError("db down"), [S.COMMIT]),
    "GARBAGE_ROLLBACK": ("yes please", [S.ROLLBACK]),
    "CHECK_RAISES_COMMIT": (S.UNKNOW, [ValueError("check broke"), S.COMMIT]),
    "CHECK_GARBAGE_COMMIT": (S.UNKNOW, [True, S.COMMIT]),
}
EXPECTED_STATE = {
    "COMMIT": S.COMMIT, "ROLLBACK": S.ROLLBACK, "RAISE_COMMIT": S.UNKNOW, "GARBAGE_ROLLBACK": S.UNKNOW,
}
EXPECTED_CHECKS = {
    "U_COMMIT": 1, "U_ROLLBACK": 1, "UU_COMMIT": 2, "U_FOREVER": 3, "RAISE_COMMIT": 1,
    "GARBAGE_ROLLBACK": 1, "CHECK_RAISES_COMMIT": 2, "CHECK_GARBAGE_COMMIT": 2,
}
DELIVERED = {"COMMIT", "U_COMMIT", "UU_COMMIT", "RAISE_COMMIT", "CHECK_RAISES_COMMIT", "CHECK_GARBAGE_COMMIT"}


def test_outcome_table_through_txmsg(make_app: Any, txmsg_grpc_broker: Any, caplog: Any) -> None:
    caplog.set_level(logging.ERROR, logger="txmsg.transaction")
    topic, group = unique("Tx5App"), unique("pg5_table")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    registry = ListenerRegistry()
    checks: Counter[str] = Counter()
    lock = threading.Lock()

    @registry.transactional_listener(group=group, topics=[topic])
    class Table:
        def execute_local(self, message: Message, row: str) -> Any:
            answer = TABLE[row][0]
            if isinstance(answer, Exception):
                raise answer
            return answer

        def check_local(self, message: Message) -> Any:
            row = message.keys or ""
            with lock:
                index = checks[row]
                checks[row] += 1
            answers = TABLE[row][1]
            answer = answers[min(index, len(answers) - 1)]
            if isinstance(answer, Exception):
                raise answer
            return answer

    with Clients(txmsg_grpc_broker.namesrv_addr) as clients:
        delivered = clients.consumer(unique("Tx5AppCG"), topic)
        discarded = clients.consumer(unique("Tx5AppDiscardCG"), CHECK_MAX_TIME_TOPIC)
        with make_app(registry) as app:
            producer = app.producer(group)
            sent = {}
            for row in TABLE:
                result = producer.send_in_transaction(topic, f"body-{row}", arg=row, keys=row, tags="TagA")
                assert result.local_state == EXPECTED_STATE.get(row, S.UNKNOW), row
                assert result.send_status == "SEND_OK"
                assert result.transaction_key == result.message_id
                sent[row] = result.transaction_key

            def done() -> bool:
                with lock:
                    return all(checks[k] >= v for k, v in EXPECTED_CHECKS.items())

            wait_until(done, timeout=40, message="every expected check-back")
            wait_until(lambda: {r.keys for r in delivered} >= DELIVERED, timeout=15, message="commits delivered")
            wait_until(lambda: {r.keys for r in discarded} == {"U_FOREVER"}, timeout=20, message="U_FOREVER discarded")
            time.sleep(2.5)  # two more check intervals: nothing else is checked or delivered
            with lock:
                assert dict(checks) == EXPECTED_CHECKS
    counts = Counter(r.keys for r in delivered)
    assert counts == Counter(DELIVERED), counts  # exactly once each, never the others
    for item in delivered:
        assert item.body == f"body-{item.keys}".encode()
        assert item.msg_id == sent[item.keys]
        assert item.tags == "TagA"
    errors = "\n".join(r.getMessage() for r in caplog.records)
    assert "execute_local raised RuntimeError: db down" in errors
    assert "check_local raised ValueError: check broke" in errors
    assert "check_local returned True" in errors
    log = read_log(txmsg_grpc_broker.log_dir)
    # UNKNOW answers to checks are sent (as TRANSACTION_RESOLUTION_UNSPECIFIED): the broker logs them
    assert "but it's pending status." in log
    assert log.count(f"Check transaction. real_topic={topic},uniqKey={sent['U_FOREVER']},") == 3


def test_send_errors_map_as_on_the_rocketmq_backend(make_app: Any, txmsg_grpc_broker: Any) -> None:
    topic, group = unique("Tx5Err"), unique("pg5_err")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    ran: list[str] = []
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic])
    class Listener:
        def execute_local(self, message: Message, arg: Any) -> S:
            ran.append(message.topic)
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    app = make_app(registry)
    with app:
        producer = app.producer(group)
        with pytest.raises(SendError, match="local transaction did not run"):
            producer.send_in_transaction(unique("NoSuchTopic5"), "x")
        with pytest.raises(InvalidMessageError, match="empty message body"):
            producer.send_in_transaction(topic, b"")
        with pytest.raises(InvalidNameError, match="at most 127"):
            producer.send_in_transaction("t" * 128, "x")
        assert ran == []
        assert producer.stats().failed == 2  # refused by the backend: counted as failed sends
    with pytest.raises(ProducerClosedError):
        producer.send_in_transaction(topic, "late")


def test_names_and_config_select_the_backend(make_app: Any, txmsg_grpc_broker: Any) -> None:
    app = make_app()
    with pytest.raises(InvalidNameError, match="127"):
        app.add_transactional_listener(_Committer(), group="pg5_names", topics=["t" * 128])
    with pytest.raises(InvalidNameError, match="system topic"):
        app.add_transactional_listener(_Committer(), group="pg5_names", topics=["rmq_sys_x"])
    config = load_config(env={"TXMSG_BACKEND": "rocketmq5", "TXMSG_ENDPOINTS": txmsg_grpc_broker.grpc_endpoint})
    assert (config.backend, config.endpoints) == ("rocketmq5", txmsg_grpc_broker.grpc_endpoint)


def test_two_groups_may_not_declare_one_topic(make_app: Any, txmsg_grpc_broker: Any) -> None:
    """A 5.x proxy routes check-backs by topic: a shared topic would mix the groups' checks."""
    topic = unique("Tx5Shared")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    registry = ListenerRegistry()
    for name in ("pg5_a", "pg5_b"):
        registry.add_transactional_listener(_Committer(), group=unique(name), topics=[topic])
    app = make_app(registry)
    with pytest.raises(ListenerDefinitionError, match="routes check-backs by topic"):
        app.start()


def test_check_backs_reach_a_topic_the_listener_did_not_declare(make_app: Any, txmsg_grpc_broker: Any) -> None:
    topic, group = unique("Tx5Undeclared"), unique("pg5_undeclared")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    checked = threading.Event()
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group)
    class Late:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        def check_local(self, message: Message) -> S:
            checked.set()
            return S.ROLLBACK

    with make_app(registry) as app:
        app.producer(group).send_in_transaction(topic, "later")
        assert checked.wait(15), "no check-back for a topic first seen at send time"


class _Committer:
    def execute_local(self, message: Message, arg: Any) -> S:
        return S.COMMIT

    def check_local(self, message: Message) -> S:
        return S.COMMIT
