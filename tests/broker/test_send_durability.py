"""Acknowledged sends survive ``kill -9`` of the broker, in both flush modes (see the README)."""

from __future__ import annotations

import pytest
from rocketmq.client import Message, SendStatus, TransactionStatus
from txmsg_broker.store import MessageStore
from txmsg_broker.testing import Clients, unique
from txmsg_broker.topics import HALF_TOPIC


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_acknowledged_messages_survive_kill_9(txmsg_broker_factory, flush):
    broker = txmsg_broker_factory(flush=flush, check_interval_ms=60000)
    topic = unique("Durable")
    acked = set()
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.producer()
        tx_producer = clients.transaction_producer(
            unique("DurPG"), lambda m: TransactionStatus.UNKNOWN
        )
        for i in range(40):
            msg = Message(topic)
            msg.set_body(f"m{i}".encode())
            result = producer.send_sync(msg)
            assert result.status == SendStatus.OK
            acked.add(result.msg_id)
        half = Message(topic)
        half.set_body(b"half")
        half_id = tx_producer.send_message_in_transaction(
            half, lambda m, a: TransactionStatus.UNKNOWN
        ).msg_id
        broker.kill()  # SIGKILL right after the last acknowledgement
    with MessageStore(broker.data_dir) as store:
        stored = {m.properties["UNIQ_KEY"] for q in range(4) for m in store.get(topic, q, 0, 1000)}
        halves = [m.properties["UNIQ_KEY"] for m in store.get(HALF_TOPIC, 0, 0, 1000)]
    assert stored == acked
    assert halves == [half_id]
