"""kill -9 the broker (``--flush sync``) and restart it: nothing acknowledged is lost, offsets, pending half
messages and scheduled (delayed/retry) messages survive. All with the real client."""

from __future__ import annotations

import socket
import threading
from collections import Counter
from pathlib import Path

from rocketmq.client import Message, SendStatus, TransactionStatus
from rocketmq.exceptions import RocketMQException
from txmsg_broker.app import BrokerProcess
from txmsg_broker.codec import PULL_MESSAGE, PULL_NOT_FOUND, QUERY_CONSUMER_OFFSET, RemotingCommand
from txmsg_broker.message_codec import decode_messages
from txmsg_broker.rawclient import call, connect, read_command
from txmsg_broker.testing import Clients, unique, wait_until


def _msg(topic: str, body: str, *, delay_level: int = 0) -> Message:
    msg = Message(topic)
    msg.set_keys(body)
    msg.set_tags("TagA")
    msg.set_body(body.encode())
    if delay_level:
        msg.set_delay_time_level(delay_level)
    return msg


def _committed_on(broker, group: str, topic: str, queue_id: int = 0) -> int:
    r = call(
        broker.broker_addr,
        QUERY_CONSUMER_OFFSET,
        {"consumerGroup": group, "topic": topic, "queueId": queue_id},
    )
    return int(r.ext_fields.get("offset", "-1")) if r.code == 0 else -1


def _committed(broker, group: str, topic: str) -> list[int]:
    return [_committed_on(broker, group, topic, queue_id) for queue_id in range(4)]


def test_acknowledged_sends_survive_kill_9(txmsg_broker_factory):
    broker = txmsg_broker_factory(flush="sync")
    topic = unique("KillT")
    acked: list[str] = []
    stop = threading.Event()
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.producer()
        producer.send_sync(_msg(topic, "warm-up"))

        def send_forever() -> None:
            i = 0
            while not stop.is_set():
                body = f"k{i}"
                i += 1
                try:
                    if producer.send_sync(_msg(topic, body)).status == SendStatus.OK:
                        acked.append(body)
                except RocketMQException:  # the broker is gone: those were never acknowledged
                    stop.wait(0.05)

        sender = threading.Thread(target=send_forever)
        sender.start()
        wait_until(lambda: len(acked) >= 200, timeout=30)
        broker.kill()
        stop.set()
        sender.join(30)
        acked_before_kill = set(acked)
        broker.start()
        received = clients.consumer(unique("CG"), topic)  # a new group starts at offset 0
        wait_until(
            lambda: {r.body.decode() for r in received} >= acked_before_kill,
            timeout=60,
            message=lambda: (
                f"every acknowledged send; lost: {sorted(acked_before_kill - {r.body.decode() for r in received})[:20]}"
            ),
        )


def test_consumer_offsets_survive_kill_9_without_redelivery(txmsg_broker_factory):
    broker = txmsg_broker_factory(flush="sync")
    topic, group = unique("OffT"), unique("CG")
    first = {f"a{i}" for i in range(60)}
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.producer()
        for body in sorted(first):
            producer.send_sync(_msg(topic, body))
        with Clients(broker.namesrv_addr) as consumers:
            received = consumers.consumer(group, topic)
            wait_until(lambda: {r.body.decode() for r in received} >= first, timeout=30)
            # the running client commits offsets every 5 s (oneway UPDATE_CONSUMER_OFFSET)
            wait_until(
                lambda: sum(_committed(broker, group, topic)) == len(first),
                timeout=20,
                message=lambda: (
                    f"the offsets to be committed; committed: {_committed(broker, group, topic)}"
                ),
            )
        committed = _committed(broker, group, topic)
        broker.kill()
        broker.start()
        assert _committed(broker, group, topic) == committed
        second = {f"b{i}" for i in range(20)}
        for body in sorted(second):  # the producer reconnects by itself
            assert producer.send_sync(_msg(topic, body)).status == SendStatus.OK
        again = clients.consumer(group, topic)
        wait_until(lambda: {r.body.decode() for r in again} >= second, timeout=30)
        # A consumer that lost its offsets would pull each queue from 0: the a* messages come before
        # the b* ones of the same queue, and its committed offsets only pass them once they were consumed.
        total = len(first) + len(second)
        wait_until(
            lambda: sum(_committed(broker, group, topic)) == total,
            timeout=20,
            message=lambda: (
                f"the offsets to cover all {total} messages; committed: {_committed(broker, group, topic)}"
            ),
        )
        counts = Counter(r.body.decode() for r in again)
        assert set(counts) == second, f"redelivered after restart: {sorted(set(counts) - second)}"
        assert max(counts.values()) == 1


def test_pending_half_message_is_checked_after_restart(txmsg_broker_factory):
    # learn_producers_from_sends: a restarted (real) broker knows no producer until librocketmq's next
    # periodic heartbeat (22 s once); with this test's 500 ms interval and check-max 3, its "channel table
    # is empty" checks would discard the half message first, as Java does. This test is about the half
    # message surviving kill -9, so let the send re-register the group.
    broker = txmsg_broker_factory(
        flush="sync",
        transaction_timeout_ms=2000,
        check_interval_ms=500,
        learn_producers_from_sends=True,
    )
    topic, group = unique("HalfT"), unique("TxPG")
    checked: list[str] = []

    def checker(msg):
        checked.append(msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys)
        return TransactionStatus.COMMIT

    with Clients(broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(group, checker)
        result = producer.send_message_in_transaction(
            _msg(topic, "pending"), lambda m, a: TransactionStatus.UNKNOWN
        )
        assert result.status == SendStatus.OK
        broker.kill()  # well before transactionTimeOut: no check has happened yet
        assert checked == []
        broker.start()
        # a send tells the restarted broker where the producer group lives (its heartbeat may be 30 s away)
        producer.send_message_in_transaction(
            _msg(topic, "committed"), lambda m, a: TransactionStatus.COMMIT
        )
        received = clients.consumer(unique("CG"), topic)  # a new group reads from offset 0
        wait_until(
            lambda: {r.body for r in received} >= {b"pending", b"committed"},
            timeout=40,
            message=lambda: (
                f"both messages; checked={checked} received={[r.body for r in received]}"
            ),
        )
        assert checked.count("pending") >= 1


def _visible(broker, topic: str) -> list[bytes]:
    bodies = []
    for queue_id in range(4):
        r = call(
            broker.broker_addr,
            PULL_MESSAGE,
            {
                "consumerGroup": "inspect",
                "topic": topic,
                "queueId": queue_id,
                "queueOffset": "0",
                "maxMsgNums": 32,
                "sysFlag": 0,
            },
        )
        if r.code == 0:
            bodies += [m.plain_body() for m in decode_messages(r.body)]
    return bodies


def _scheduled_done(broker, *, level: int) -> int:
    """The delay scheduler's progress on a level: a consumer offset of SCHEDULE_GROUP."""
    r = call(
        broker.broker_addr,
        QUERY_CONSUMER_OFFSET,
        {"consumerGroup": "SCHEDULE_GROUP", "topic": "SCHEDULE_TOPIC_XXXX", "queueId": level - 1},
    )
    return int(r.ext_fields.get("offset", "-1")) if r.code == 0 else -1


def test_delayed_message_survives_kill_9(txmsg_broker_factory):
    """A DELAY level 3 message (10 s x scale 0.2 = 2 s) waits in SCHEDULE_TOPIC_XXXX and is delivered after restart."""
    broker = txmsg_broker_factory(flush="sync", delay_scale=0.2)
    topic = unique("DelayT")
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.producer()
        producer.send_sync(_msg(topic, "later", delay_level=3))
        producer.send_sync(_msg(topic, "now"))
        assert _visible(broker, topic) == [b"now"]
        broker.kill()
        broker.start()
        group = unique("CG")
        received = clients.consumer(group, topic)
        wait_until(lambda: any(r.body == b"later" for r in received), timeout=30)
        # the scheduler records its progress after each delivery: once level 3 (queue 2) is at 1, it
        # has put "later" into the topic and will not put it again
        wait_until(
            lambda: _scheduled_done(broker, level=3) == 1,
            timeout=10,
            message="the scheduler's offset",
        )
        assert sorted(_visible(broker, topic)) == [b"later", b"now"]
        wait_until(
            lambda: sum(max(0, o) for o in _committed(broker, group, topic)) == 2,
            timeout=20,
            message=lambda: (
                f"the consumer to commit both; committed: {_committed(broker, group, topic)}"
            ),
        )
        assert sorted(r.body for r in received) == [b"later", b"now"]


def test_clean_stop_answers_held_pulls(txmsg_broker):
    """On SIGTERM held long polls are answered (librocketmq would otherwise wait out its 30 s timeout)."""
    topic = unique("HoldT")
    assert (
        call(
            txmsg_broker.broker_addr,
            QUERY_CONSUMER_OFFSET,
            {"consumerGroup": "g", "topic": topic, "queueId": 0},
        ).code
        == 0
    )
    group = unique("HoldG")
    sock = connect(txmsg_broker.broker_addr, timeout=20)
    with sock:
        # sysFlag 3 = commit offset + suspend: the broker commits commitOffset and then, finding nothing,
        # holds the pull in the same step, so a visible commit means the pull is held
        pull = RemotingCommand.request(
            PULL_MESSAGE,
            {
                "consumerGroup": group,
                "topic": "TBW102",
                "queueId": 0,
                "queueOffset": "0",
                "maxMsgNums": 32,
                "sysFlag": 3,
                "commitOffset": "1",
                "suspendTimeoutMillis": "15000",
            },
            opaque=77,
        )
        sock.sendall(pull.encode())
        wait_until(
            lambda: _committed_on(txmsg_broker, group, "TBW102") == 1,
            timeout=10,
            message="the pull to be held",
        )
        stopper = threading.Thread(target=txmsg_broker.stop)
        stopper.start()
        response = read_command(sock)
        stopper.join(20)
    assert response.opaque == 77
    assert response.code == PULL_NOT_FOUND
    assert response.ext_fields["nextBeginOffset"] == "0"


def test_ports_left_to_the_broker_are_kept_out_of_the_ephemeral_range(tmp_path):
    """Ports given as 0 are chosen below the kernel's ephemeral range, so no outgoing connection
    of any process takes one while the broker is down, and a restart binds them again (a CI run
    lost a gRPC port to one between stop() and start())."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    broker = BrokerProcess(tmp_path / "data", tmp_path / "logs", grpc_port=0).start()
    try:
        ports = (broker.namesrv_port, broker.broker_port, broker.settings["grpc_port"])
        assert all(10000 <= port < low for port in ports), ports
        broker.restart()
        assert (broker.namesrv_port, broker.broker_port, broker.settings["grpc_port"]) == ports
        with socket.create_connection(("127.0.0.1", broker.broker_port), timeout=10):
            pass
    finally:
        broker.stop()
