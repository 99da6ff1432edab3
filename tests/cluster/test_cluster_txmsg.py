"""Several brokers with the real client through txmsg (issue 12.3): a name server process and two
broker processes (broker-a, broker-b), each with its own half queue and check loop.

* transactions spread over both brokers' queues, UNKNOW ones are checked back by both brokers, and
  two consumer instances of one group share both brokers' queues;
* ``kill -9`` of broker-b while transactions run, then its restart: every committed message is
  consumed (counted by key), nothing rolled back is, and the half messages left on broker-b are
  checked after its restart.

Nothing is timed: each step waits for an observable event (``wait_until``).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker import codec
from txmsg_broker.rawclient import call
from txmsg_broker.testing import create_topic, read_log, unique, wait_until

from txmsg import LocalTransactionState, Message, TxMsg, TxMsgError
from txmsg.config import TxMsgConfig

S = LocalTransactionState


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[Any]:
    apps: list[TxMsg] = []

    def make(namesrv: str) -> TxMsg:
        config = TxMsgConfig(
            name_server=namesrv, client_log_dir=str(tmp_path / "client-logs"), instance_prefix="cl"
        )
        app = TxMsg(config, backend="rocketmq")
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close(timeout=20)


class Consumed:
    """Deliveries counted by key (the idempotent consumer's view) and by consumer instance."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: Counter[str] = Counter()
        self.by_instance: Counter[str] = Counter()

    def handler(self, instance: str) -> Any:
        def consume(message: Message) -> None:
            with self.lock:
                self.by_key[message.keys or ""] += 1
                self.by_instance[instance] += 1

        return consume

    def seen_keys(self) -> set[str]:
        with self.lock:
            return set(self.by_key)


def messages_per_broker(cluster: Any, topic: str) -> dict[str, int]:
    """Messages stored in ``topic``'s queues, per broker (max offsets of its 4 queues)."""
    out = {}
    for name, addr in cluster.broker_addrs.items():
        out[name] = sum(
            int(call(addr, codec.GET_MAX_OFFSET, {"topic": topic, "queueId": q}).ext("offset", "0"))
            for q in range(4)
        )
    return out


def checks_of(log_dir: Path, topic: str, since: int = 0) -> int:
    return read_log(log_dir)[since:].count(f"Check transaction. real_topic={topic},")


def consumers_known(cluster: Any, group: str) -> dict[str, int]:
    out = {}
    for name, addr in cluster.broker_addrs.items():
        answer = call(addr, codec.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        out[name] = (
            len(json.loads(answer.body)["consumerIdList"]) if answer.code == codec.SUCCESS else 0
        )
    return out


def test_transactions_spread_over_both_brokers_which_both_check_back(
    txmsg_broker_factory: Any, make_app: Any
) -> None:
    cluster = txmsg_broker_factory(brokers=2, transaction_log_level="DEBUG")
    ns = cluster.namesrv_addr
    topic, group, consumers = unique("cl_topic"), unique("pg_cl"), unique("cg_cl")
    create_topic(ns, topic, message_type="TRANSACTION")
    consumed = Consumed()

    sender = make_app(ns)

    @sender.transactional_listener(group=group, topics=[topic])
    class Orders:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW if arg == "later" else S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    sender.message_listener(topic=topic, group=consumers)(consumed.handler("c1"))
    other = make_app(ns)
    other.message_listener(topic=topic, group=consumers)(consumed.handler("c2"))

    with sender, other:
        wait_until(
            lambda: set(consumers_known(cluster, consumers).values()) == {2},
            timeout=60,
            message=lambda: (
                f"both consumers registered on both brokers: {consumers_known(cluster, consumers)}"
            ),
        )
        producer = sender.producer(group)
        keys = {f"k{i}" for i in range(32)}
        for i in range(32):
            producer.send_in_transaction(
                topic, f"m{i}".encode(), keys=f"k{i}", arg="later" if i % 2 else "now"
            )
        wait_until(
            lambda: keys <= consumed.seen_keys(),
            timeout=90,
            message=lambda: (
                f"all {len(keys)} messages consumed, missing {sorted(keys - consumed.seen_keys())}"
            ),
        )
        per_broker = messages_per_broker(cluster, topic)
        per_instance = dict(consumed.by_instance)

    assert sum(per_broker.values()) == 32, per_broker
    assert all(n > 0 for n in per_broker.values()), (
        f"messages landed on one broker only: {per_broker}"
    )
    for proc in cluster.brokers:  # each broker checked back its own UNKNOW half messages
        assert checks_of(proc.log_dir, topic) > 0, (
            f"{proc.settings['broker_name']} checked nothing back"
        )
    assert set(per_instance) == {"c1", "c2"}, f"one consumer got every queue: {per_instance}"
    assert set(consumed.by_key) == keys


@pytest.mark.slow
def test_a_broker_killed_and_restarted_mid_run_loses_nothing(
    txmsg_broker_factory: Any, make_app: Any
) -> None:
    # a restarted broker learns the producer group only from its next heartbeat (up to 30 s, as a
    # real broker): the check horizon (max x interval) must outlast that
    cluster = txmsg_broker_factory(brokers=2, transaction_log_level="DEBUG", check_max=200)
    ns = cluster.namesrv_addr
    broker_b = cluster.broker("broker-b")
    topic, group, consumers = unique("cl_kill"), unique("pg_kill"), unique("cg_kill")
    create_topic(ns, topic, message_type="TRANSACTION")
    consumed = Consumed()
    released = threading.Event()  # until set, check_local keeps every UNKNOW transaction pending

    def decision(key: str) -> S:
        return S.ROLLBACK if int(key[1:]) % 5 == 0 else S.COMMIT

    app = make_app(ns)

    @app.transactional_listener(group=group, topics=[topic])
    class Payments:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW if arg == "later" else decision(message.keys or "")

        def check_local(self, message: Message) -> S:
            return decision(message.keys or "") if released.is_set() else S.UNKNOW

    app.message_listener(topic=topic, group=consumers)(consumed.handler("c1"))
    sent_ok: list[str] = []
    failed: list[str] = []
    stop = threading.Event()

    def pay(producer: Any) -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            key = f"k{i}"
            try:
                producer.send_in_transaction(
                    topic, key.encode(), keys=key, arg="later" if i % 2 else "now"
                )
                sent_ok.append(key)
            except TxMsgError:
                failed.append(key)
            stop.wait(0.02)

    with app:
        payer = threading.Thread(target=pay, args=(app.producer(group),), daemon=True)
        payer.start()
        try:
            # UNKNOW half messages pending on broker-b (checked, answered UNKNOW) when it dies
            wait_until(
                lambda: checks_of(broker_b.log_dir, topic) >= 3,
                timeout=60,
                message="checks on broker-b",
            )
            broker_b.kill()
            killed_at = len(sent_ok)
            wait_until(
                lambda: len(sent_ok) >= killed_at + 20,
                timeout=120,
                message="sends while broker-b is down",
            )
            since = len(read_log(broker_b.log_dir))
            broker_b.start()
            released.set()
            restarted_at = len(sent_ok)
            wait_until(
                lambda: len(sent_ok) >= restarted_at + 20,
                timeout=120,
                message="sends after the restart",
            )
        finally:
            stop.set()
            payer.join(30)
        committed = {k for k in sent_ok if decision(k) is S.COMMIT}
        wait_until(
            lambda: committed <= consumed.seen_keys(),
            timeout=180,
            message=lambda: (
                f"every committed message consumed; missing {sorted(committed - consumed.seen_keys())}"
            ),
        )
        wait_until(
            lambda: checks_of(broker_b.log_dir, topic, since) > 0,
            timeout=60,
            message="broker-b checking its half messages after the restart",
        )

    rolled_back = {k for k in consumed.seen_keys() if decision(k) is S.ROLLBACK}
    assert not rolled_back, f"rolled-back transactions delivered: {sorted(rolled_back)}"
    # a send that failed may still have left a half message that a check-back committed
    assert consumed.seen_keys() - committed <= set(failed)
    assert messages_per_broker(cluster, topic)["broker-b"] > 0
