"""The embedded broker as a 5.3.3 broker (``broker_version``): op-record batching and GET_BROKER_CONFIG.

5.1+ brokers write a transaction's commit/rollback op record in batches (``transactionOpBatchInterval``,
3000 ms; ``TransactionalOpBatchService``).  With ``transactionTimeOut`` below it, the check service sees
finished transactions as pending: it checks them back, a COMMIT answer stores a committed message again and
delivers a rolled-back one.  The same run on a 4.9.8 broker (op records at once) checks neither.  What the
real 5.3.3 did is in docs/rocketmq-facts.md.
"""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace

import pytest
from rocketmq.client import Message, TransactionStatus
from txmsg_broker.codec import GET_MAX_OFFSET, SUCCESS
from txmsg_broker.config import BrokerConfig
from txmsg_broker.rawclient import call
from txmsg_broker.testing import Clients, create_topic, read_log, unique, wait_until
from txmsg_broker.transaction_service import op_offsets
from txmsg_rocketmq import broker_config
from txmsg_rocketmq.doctor import broker_transaction_settings

C, R = TransactionStatus.COMMIT, TransactionStatus.ROLLBACK


def test_broker_version_chooses_the_defaults() -> None:
    four = BrokerConfig()
    assert (four.broker_version, four.log_format, four.check_interval_ms) == ("4.9.8", 4, 60000)
    assert four.op_batch_interval_ms == 0  # 4.9.8 writes op records at once
    five = BrokerConfig(broker_version="5.3.3")
    assert (five.log_format, five.check_interval_ms, five.op_batch_interval_ms) == (5, 30000, 3000)
    assert five.transaction_op_msg_max_size == 4096
    grpc = BrokerConfig(grpc_port=0)  # the gRPC endpoint is the 5.x proxy's protocol
    assert grpc.broker_version == "5.3.3"
    assert grpc.op_batch_interval_ms == 3000
    assert BrokerConfig(grpc_port=0, broker_version="4.9.8").op_batch_interval_ms == 0
    explicit = BrokerConfig(broker_version="5.3.3", log_format=4, check_interval_ms=1000)
    assert (explicit.log_format, explicit.check_interval_ms) == (4, 1000)  # given settings win
    assert (
        BrokerConfig(
            broker_version="5.3.3", transaction_op_batch_interval_ms=0
        ).op_batch_interval_ms
        == 0
    )


def test_bad_broker_version_settings_say_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"broker_version must be 4\.9\.8 or 5\.3\.3"):
        BrokerConfig(broker_version="5.1")
    with pytest.raises(ValueError, match=r"a 4\.9\.8 broker writes op records at once.*5\.3\.3"):
        BrokerConfig(transaction_op_batch_interval_ms=500)
    with pytest.raises(ValueError, match="must be 0"):
        BrokerConfig(broker_version="5.3.3", transaction_op_batch_interval_ms=-1)


def test_op_record_bodies_of_both_versions_are_read() -> None:
    assert op_offsets(b"12") == [12]  # 4.9.8: the bare offset
    assert op_offsets(b"12,13,40,") == [12, 13, 40]  # 5.x: "<offset>," per transaction


def test_get_broker_config_and_the_doctor_warning(txmsg_broker_factory) -> None:
    """GET_BROKER_CONFIG (26) answers a properties text under the real key names; the doctor reads it."""
    four = txmsg_broker_factory(broker_version="4.9.8")
    five = txmsg_broker_factory(broker_version="5.3.3")  # fixtures' transactionTimeOut 1000 < 3000
    good = txmsg_broker_factory(broker_version="5.3.3", transaction_op_batch_interval_ms=200)
    near = txmsg_broker_factory(broker_version="5.3.3", transaction_op_batch_interval_ms=600)
    props4 = broker_config.broker_config(four.broker_addr)
    props5 = broker_config.broker_config(five.broker_addr)
    assert props4["transactionTimeOut"] == "1000"
    assert props4["transactionCheckMax"] == "3"
    assert "transactionOpBatchInterval" not in props4  # no such setting before 5.1
    assert props5["transactionOpBatchInterval"] == "3000"
    assert props5["transactionOpMsgMaxSize"] == "4096"
    assert props5["brokerName"] == "broker-a"
    assert props5["listenPort"] == five.broker_addr.rsplit(":", 1)[1]

    (row4,) = broker_transaction_settings(four.namesrv_addr)
    assert row4[2] is True
    assert "a 4.x broker" in row4[1]
    (row5,) = broker_transaction_settings(five.namesrv_addr)
    assert row5[2] is False
    for words in (
        "transactionTimeOut < transactionOpBatchInterval",
        "checks back transactions that already committed or rolled back",
        "COMMIT answer stores the message again",
        "rolled-back transaction delivers it",
        "Set transactionTimeOut above transactionOpBatchInterval",
    ):
        assert words in row5[1], row5[1]
    (row_good,) = broker_transaction_settings(good.namesrv_addr)
    assert row_good[2] is True, row_good[1]
    assert "op batches are written within the transaction timeout" in row_good[1]
    # the 5.x client's births in whole seconds: 2 x 200 + 1000 > 1000, a note (still ok)
    (row_good5,) = broker_transaction_settings(good.namesrv_addr, born_slack_ms=1000)
    assert row_good5[2] is True, row_good5[1]
    for words in ("first op batch after a broker start", "whole seconds", "at least 1400"):
        assert words in row_good5[1], row_good5[1]
    # above the batch but below two batches: the first batch after a start may still be checked
    (row_near,) = broker_transaction_settings(near.namesrv_addr)
    assert row_near[2] is True, row_near[1]
    assert "note: the first op batch after a broker start" in row_near[1], row_near[1]
    assert "whole seconds" not in row_near[1]
    assert "at least 1200" in row_near[1], row_near[1]


def _run_commit_and_rollback(broker, answer_all_commit: bool) -> tuple[Counter[str], Counter[str]]:
    """Send 3 committed and 3 rolled-back transactions; the checker answers COMMIT for everything
    (a check_local that does not know rollbacks) - returns (checks, deliveries) per key."""
    topic = unique("TxBatch")
    create_topic(broker.namesrv_addr, topic)
    checks: Counter[str] = Counter()
    lock = threading.Lock()

    def checker(msg):
        key = msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys
        with lock:
            checks[key] += 1
        return C if answer_all_commit or key.startswith("C") else R

    with Clients(broker.namesrv_addr) as clients:
        delivered = clients.consumer(unique("TxBatchCG"), topic)
        producer = clients.transaction_producer(unique("TxBatchPG"), checker)
        for n in range(3):
            for key, state in ((f"C{n}", C), (f"R{n}", R)):
                msg = Message(topic)
                msg.set_keys(key)
                msg.set_body(key.encode())
                producer.send_message_in_transaction(msg, lambda m, a, s=state: s)
        clients.heartbeat(producer)  # after the first send (see Clients.heartbeat)
        wait_until(lambda: {r.keys for r in delivered} >= {"C0", "C1", "C2"}, timeout=15)
        # transactionTimeOut 1 s, passes every 1-2 s, batches every 3 s (the broker's manual
        # clock): all settled, every check answered and applied, before advance returns
        assert broker.advance(8).unanswered == ()
        # and the consumer has what the topic stores: nothing more can be delivered
        wait_until(
            lambda: len(delivered) >= _stored(broker, topic),
            timeout=15,
            message=lambda: f"every stored message delivered; delivered {len(delivered)}",
        )

        def settled() -> bool:  # every COMMIT answer of a check has been delivered by now
            with lock:
                got = Counter(r.keys for r in delivered)
                return all(got[f"C{n}"] == 1 + checks[f"C{n}"] for n in range(3)) and all(
                    got[f"R{n}"] == (checks[f"R{n}"] if answer_all_commit else 0) for n in range(3)
                )

        wait_until(
            settled,
            timeout=15,
            message=lambda: (
                f"checks {dict(checks)}, delivered {Counter(r.keys for r in delivered)}"
            ),
        )
        with lock:
            return Counter(checks), Counter(r.keys for r in delivered)


def test_5x_broker_checks_finished_transactions_when_the_timeout_is_below_the_batch(
    txmsg_broker_factory,
) -> None:
    """As the real 5.3.3 did with transactionTimeOut 2000 < transactionOpBatchInterval 3000."""
    broker = txmsg_broker_factory(
        broker_version="5.3.3", check_max=5, log_format=5, manual_clock=True
    )
    checks, delivered = _run_commit_and_rollback(broker, answer_all_commit=True)
    # the first op batch after a start comes 3-6 s after the first commit, the timeout is 1 s
    assert sum(checks[f"R{n}"] for n in range(3)) >= 1, checks
    assert sum(checks[f"C{n}"] for n in range(3)) >= 1, checks
    # every COMMIT answer stored the message (again): rolled-back ones delivered once per check,
    # committed ones 1 + once per check
    for n in range(3):
        assert delivered[f"R{n}"] == checks[f"R{n}"], (checks, delivered)
        assert delivered[f"C{n}"] == 1 + checks[f"C{n}"], (checks, delivered)
    log = read_log(broker.log_dir)
    assert "Start transaction op batch thread!" in log
    assert "Check transaction. real_topic=" in log  # 5.x: an INFO line per check-back


def test_4x_broker_and_a_short_batch_check_no_finished_transaction(txmsg_broker_factory) -> None:
    """Op records at once (4.9.8), or batched well within the timeout: nothing finished is checked."""
    for settings in (
        {"broker_version": "4.9.8"},
        {"broker_version": "5.3.3", "transaction_op_batch_interval_ms": 100},
    ):
        broker = txmsg_broker_factory(**settings, manual_clock=True)
        checks, delivered = _run_commit_and_rollback(broker, answer_all_commit=True)
        assert checks == Counter(), settings
        assert delivered == Counter({"C0": 1, "C1": 1, "C2": 1}), settings


def test_rocketmq5_doctor_reads_the_settings_through_a_name_server(txmsg_broker_factory) -> None:
    """gRPC cannot read them; with a name server configured (and the remoting reader installed)
    the rocketmq5 doctor reports each master's settings, else what to check by hand."""
    doctor5 = pytest.importorskip("txmsg_rocketmq5.doctor")
    broker = txmsg_broker_factory(grpc_port=0)  # 5.3.3: 1000 ms timeout < 3000 ms batch
    (row,) = doctor5._broker_settings(SimpleNamespace(name_server=broker.namesrv_addr))
    assert row[0].endswith(f"(via name server {broker.namesrv_addr})")
    assert row[2] is False
    assert "transactionOpBatchInterval=3000" in row[1]
    (advice,) = doctor5._broker_settings(SimpleNamespace(name_server="127.0.0.1:1"))
    assert advice == doctor5.BROKER_SETTINGS_ADVICE
    assert "not readable over gRPC" in advice[1]
    assert "mqadmin getBrokerConfig" in advice[1]
    assert doctor5._broker_settings(SimpleNamespace()) == [doctor5.BROKER_SETTINGS_ADVICE]


@pytest.mark.parametrize(
    ("version", "delivered_keys"), [("4.9.8", {"IMM", "PLAIN"}), ("5.3.3", {"PLAIN"})]
)
def test_5x_refuses_a_late_send_phase_answer_for_an_immune_message(
    txmsg_broker_factory, version: str, delivered_keys: set[str]
) -> None:
    """5.x ``rejectCommitOrRollback``: a commit/rollback that is not ``fromTransactionCheck`` for a
    message with CHECK_IMMUNITY_TIME_IN_SECONDS, after that immunity (at least transactionTimeOut), is
    refused ("wait check").  librocketmq sends ``fromTransactionCheck=1``, which Java parses as false,
    so on 5.x its check answers for such a message are refused until the broker discards it."""
    settings = {"broker_version": version, "log_format": 5}
    if version == "5.3.3":
        settings["transaction_op_batch_interval_ms"] = 200
    broker = txmsg_broker_factory(**settings)
    topic = unique("TxImm")
    create_topic(broker.namesrv_addr, topic)
    checks: Counter[str] = Counter()

    def checker(msg):
        checks[msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys] += 1
        return C

    with Clients(broker.namesrv_addr) as clients:
        delivered = clients.consumer(unique("TxImmCG"), topic)
        producer = clients.transaction_producer(unique("TxImmPG"), checker)
        for key in ("IMM", "PLAIN"):
            msg = Message(topic)
            msg.set_keys(key)
            msg.set_body(key.encode())
            if key == "IMM":
                msg.set_property("CHECK_IMMUNITY_TIME_IN_SECONDS", "1")
            producer.send_message_in_transaction(msg, lambda m, a: TransactionStatus.UNKNOWN)
        clients.heartbeat(producer)  # after the first send (see Clients.heartbeat)
        wait_until(lambda: {r.keys for r in delivered} >= {"PLAIN"}, timeout=20)
        if version == "5.3.3":
            wait_until(
                lambda: "checked too many times" in read_log(broker.log_dir),
                timeout=20,
                message=lambda: f"the immune message to be discarded; checks {dict(checks)}",
            )

            # every check answered, every answer refused; passes inside the immunity used up counts
            # (a real 5.3.3 with these timings: 2 checks, 2 refusals, then the discard).  A
            # refusal is logged when its answer arrives, which can be after the discard line: wait
            # for one per check (no check-back is sent after the discard)
            def refused() -> int:
                return read_log(broker.log_dir).count("Message commit fail [producer end]")

            wait_until(
                lambda: checks["IMM"] >= 1 and refused() == checks["IMM"],
                timeout=20,
                message=lambda: (
                    f"a refusal per check answered; checks {dict(checks)}, refusals {refused()}"
                ),
            )
            assert 1 <= checks["IMM"] == refused() <= 3, (checks, refused())
        else:
            wait_until(lambda: {r.keys for r in delivered} >= {"IMM"}, timeout=20)
        # nothing more can arrive: the topic holds exactly the delivered keys, once each (every
        # key delivered was stored; on 5.3.3 every answer for IMM was refused and it is discarded)
        assert _stored(broker, topic) == len(delivered_keys)
        assert {r.keys for r in delivered} == delivered_keys


def _stored(broker, topic: str) -> int:
    """Messages stored in ``topic`` (the sum of its four queues' max offsets)."""
    total = 0
    for queue_id in range(4):
        answer = call(broker.broker_addr, GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
        assert answer.code == SUCCESS, answer.remark
        total += int(answer.ext("offset"))
    return total
