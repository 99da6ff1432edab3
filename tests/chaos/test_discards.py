"""The chaos run's discard figures (issue 39.4, :mod:`benchmarks.chaos.discards`): what the
brokers moved to ``TRANS_CHECK_MAX_TIME_TOPIC`` and what the rescuer did with it, read from the
broker and from the services' logs (both survive ``kill -9``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocketmq.client import Message, TransactionStatus
from txmsg_broker.testing import Clients, create_topic, unique

from benchmarks.chaos.discards import DiscardFigures, baseline, read, rescue_outcomes

KEY_A = "7F0000010AFD5025D2C3917905230000"
KEY_B = "0102FC00000001596E0B1D56D700000000"  # a 5.x client's message id
KEY_C = "7F0000010AFD5025D2C39179052D0001"
KEY_D = "7F0000010AFD5025D2C39179052D0002"

# the rescuer's lines as a chaos child process logs them (format of benchmarks.chaos.roles)
RESCUED = (
    "2026-11-29 06:01:02,345 4242 txmsg.rescue WARNING group order-tx: the broker had discarded "
    f"committed half message {KEY_A} after its last check-back; rescued: sent to order-paid as "
    "7F0000010AFD5025D2C3917905230099"
)
ROLLED_BACK = (
    "2026-11-29 06:01:03,000 4242 txmsg.rescue INFO group order-tx: discarded half message "
    f"{KEY_B} (topic order-paid) was rolled back: nothing to send"
)
PUT_BACK = (
    "2026-11-29 06:01:04,000 4242 txmsg.rescue WARNING group order-tx: discarded half message "
    f"{KEY_C} (topic order-paid): check_local answered UNKNOW (round 1 of 16); put back into "
    "the broker's check cycle, its check-backs decide"
)
SEND_FAILED = (
    "2026-11-29 06:01:05,000 4242 txmsg.rescue WARNING group order-tx: could not send discarded "
    f"half message {KEY_C} to order-paid again (SendError: timeout); the broker delivers the "
    "discarded copy again later"
)
GAVE_UP = (
    "2026-11-29 06:01:06,000 4242 txmsg.rescue ERROR group order-tx: gave up discarded half "
    f"message {KEY_C} (topic order-paid, keys k): check_local gave no answer"
)


def test_rescue_outcomes_count_each_discarded_transaction_once() -> None:
    lines = [RESCUED, ROLLED_BACK, SEND_FAILED, RESCUED]  # KEY_A handled again after a restart
    found = rescue_outcomes(lines, {KEY_A, KEY_B, KEY_C})
    assert found == {KEY_A: "rescued", KEY_B: "rolled_back"}  # KEY_C's send failed: no outcome
    assert rescue_outcomes([PUT_BACK], {KEY_C}) == {KEY_C: "put_back"}
    assert rescue_outcomes([PUT_BACK, GAVE_UP], {KEY_C}) == {KEY_C: "dead"}  # the last one wins
    # a key the brokers did not discard (the re-sent copy's id) is not a rescue
    assert rescue_outcomes([RESCUED], {KEY_B}) == {}


def test_figures_add_up() -> None:
    figures = DiscardFigures(
        copies={"broker-b": 2, "broker-a": 3},
        keys={KEY_A, KEY_B, KEY_C, KEY_D},
        outcomes={KEY_A: "rescued", KEY_B: "rolled_back", KEY_C: "put_back", KEY_D: "dead"},
    )
    assert (figures.discards, figures.rescues) == (5, 3)
    assert [figures.count(o) for o in ("rescued", "rolled_back", "put_back")] == [1, 1, 1]
    assert figures.unrescued == {KEY_D}
    assert figures.pending == set()  # the dead one was handled: nothing to wait for
    assert figures.per_broker() == "broker-a 3, broker-b 2"


@pytest.mark.txmsg_manual_clock(check_max=3, transaction_timeout_ms=2000, check_interval_ms=2000)
def test_read_finds_the_broker_discards_and_the_rescue_lines(
    txmsg_broker_factory, tmp_path: Path
) -> None:
    broker = txmsg_broker_factory()
    logs = tmp_path / "logs"
    logs.mkdir()
    assert read(broker.namesrv_addr, logs).discards == 0  # no discard topic yet: nothing
    topic = unique("ChaosDiscard")
    create_topic(broker.namesrv_addr, topic, queues=1)
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(
            unique("ChaosDiscardPG"), lambda m: TransactionStatus.UNKNOWN
        )
        msg = Message(topic)
        msg.set_keys("k")
        msg.set_body(b"b")
        sent = producer.send_message_in_transaction(msg, lambda m, a: TransactionStatus.UNKNOWN)
        clients.heartbeat(producer)
        for _ in range(12):  # three check-backs, then the discard
            broker.advance(2)
            if read(broker.namesrv_addr, logs).discards:
                break
    figures = read(broker.namesrv_addr, logs)
    assert (figures.copies, figures.keys, figures.rescues) == ({"broker-a": 1}, {sent.msg_id}, 0)
    (logs / "producer-0.log").write_text(RESCUED.replace(KEY_A, sent.msg_id) + "\n")
    (logs / "points-0.log").write_text(ROLLED_BACK + "\n")  # another key: not this run's discard
    figures = read(broker.namesrv_addr, logs)
    assert figures.outcomes == {sent.msg_id: "rescued"}
    assert figures.unrescued == set()
    # a run against an external cluster counts only what was discarded after its start
    since = baseline(broker.namesrv_addr)
    assert since == {"broker-a": 1}
    later = read(broker.namesrv_addr, logs, since)
    assert (later.copies, later.keys, later.rescues) == ({"broker-a": 0}, set(), 0)
