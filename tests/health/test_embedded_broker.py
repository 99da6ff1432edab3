"""Our embedded broker's logs (plugins/txmsg-broker/txmsg_broker) read the same as a real broker's.

Real client, real broker process (ours), then the job over its log directory; counts are
checked against the independent scan and against what the test itself did.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from txmsg_health import job

from tests.health.reference import scan

pytest.importorskip("txmsg_broker.testing")
rocketmq = pytest.importorskip("rocketmq.client")


def _send(producer: object, topic: str, key: str, state: object) -> str:
    msg = rocketmq.Message(topic)
    msg.set_keys(key)
    msg.set_body(b"health")
    return producer.send_message_in_transaction(msg, lambda m, a: state).msg_id  # type: ignore[attr-defined]


def test_job_reads_the_embedded_brokers_logs(
    spark: object, txmsg_broker_factory: object, tmp_path: Path
) -> None:
    from txmsg_broker.testing import Clients, read_log, unique, wait_until  # noqa: PLC0415 - optional: importorskip above

    TS = rocketmq.TransactionStatus
    # learn_producers_from_sends: this test is about reading the logs, not about when a broker
    # learns a group; without it the raw clients' groups become check-back targets only at
    # librocketmq's 30 s heartbeat, as on a real broker (docs/rocketmq-facts.md).
    broker = txmsg_broker_factory(  # type: ignore[operator]
        transaction_log_level="DEBUG", check_max=2, learn_producers_from_sends=True
    )
    stuck_group, ok_group, topic = unique("HStuckPG"), unique("HOkPG"), unique("HT")
    with Clients(broker.namesrv_addr) as clients:
        stuck = clients.transaction_producer(stuck_group, lambda m: TS.UNKNOWN)
        ok = clients.transaction_producer(ok_group, lambda m: TS.COMMIT)
        stuck_ids = [_send(stuck, topic, f"s{i}", TS.UNKNOWN) for i in range(3)]
        for i in range(6):
            _send(ok, topic, f"c{i}", TS.COMMIT)
        _send(ok, topic, "r", TS.ROLLBACK)
        _send(ok, topic, "u", TS.UNKNOWN)
        wait_until(
            lambda: read_log(broker.log_dir).count("has been checked too many times") >= 3,
            timeout=30,
        )
    logs = str(broker.log_dir)
    s = job.run(spark, job.JobConfig(inputs=[logs], out=str(tmp_path))).summary  # type: ignore[arg-type]
    ref = scan([logs])

    st, okg = s["groups"][stuck_group], s["groups"][ok_group]
    assert st["unknown"] == 3
    assert st["transactions_with_unknown"] == 3
    assert st["discarded"] == ref.groups[stuck_group]["discarded"] >= 3
    assert st["commit"] == 0
    assert st["unknown_share"] == 1.0
    assert okg["commit"] == 6
    assert okg["rollback"] == 1
    assert okg["unknown"] == 1
    assert okg["check_commit"] == ref.groups[ok_group]["check_commit"] >= 1
    for g in (stuck_group, ok_group):
        for k in ("unknown", "rollback", "checks", "check_unknown", "discarded"):
            assert s["groups"][g][k] == ref.groups[g][k], (g, k)
    assert stuck_group in s["flagged"]
    assert ok_group not in s["flagged"]
    assert set(s["groups"][stuck_group]["addresses"])
    assert all(a.startswith("127.0.0.1:") for a in st["addresses"])
    assert len(stuck_ids) == 3
