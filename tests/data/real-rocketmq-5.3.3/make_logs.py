"""Make the logs in this directory: two producer groups on a real RocketMQ 5.3.3 (see README.md).

Not run by the tests (they read the logs and ``truth.json`` this wrote).  Needs a real 5.3.3
broker + proxy with the topics created (README.md has the commands) and the official 5.x Python
client (``rocketmq-python-client``)::

    python make_logs.py 127.0.0.1:28081 OUT.json

Two topics, one producer per topic (a 5.x proxy logs transactions under the topic):

* ``h26-healthy``: every transaction ends at once (COMMIT or ROLLBACK) and ``check`` answers
  from the transaction's real outcome;
* ``h26-unknown``: 60 % of the transactions are left UNKNOW at send (a 5.x client then sends
  nothing); ``check`` answers UNKNOW the first time it sees one of those, then its outcome.  The
  others end at once and are checked like the healthy group's.

Every check-back the producers receive is recorded with what it answered, so ``truth.json`` says
per topic how many transactions, how many ended at once, how many check-backs were for a
transaction that had already ended (at send, or by an earlier COMMIT/ROLLBACK check answer), and
how many UNKNOW answers the producer gave.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from typing import Any

from rocketmq.grpc_protocol import TransactionResolution
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.model import Message
from rocketmq.v5.producer import Producer, TransactionChecker

HEALTHY, UNKNOWN = "h26-healthy", "h26-unknown"
PER_GROUP = 40
BURST, GAP_S = 10, 8.0
"""Sent in bursts of ``BURST`` per group, ``GAP_S`` apart: the first run showed the op batch's
lag hitting the transactions of a burst after a quiet spell."""
SETTLE_S = 40.0
"""After the last send: 3 checks 2 s apart plus the op batch (3 s) and slack."""


class Checker(TransactionChecker):
    """Answers from the recorded outcome; UNKNOW once for a transaction left UNKNOW at send."""

    def __init__(self, state: dict[str, dict[str, Any]], lock: threading.Lock) -> None:
        self.state = state
        self.lock = lock

    def check(self, message: Message) -> int:
        key = message.body.decode()
        with self.lock:
            tx = self.state[key]
            ended = tx["ended"]
            if tx["first"] == "unknown" and not tx["unknown_answered"]:
                tx["unknown_answered"] = True
                answer = "unknown"
            else:
                answer = tx["outcome"]
                tx["ended"] = True
            tx["checks"].append({"at": time.time(), "already_ended": ended, "answer": answer})
        return {
            "unknown": TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
            "commit": TransactionResolution.COMMIT,
            "rollback": TransactionResolution.ROLLBACK,
        }[answer]


def plan(topic: str) -> list[tuple[str, str, str]]:
    """(key, first-phase answer, outcome) per transaction."""
    rows = []
    for i in range(PER_GROUP):
        outcome = "rollback" if i % 4 == 3 else "commit"
        first = "unknown" if topic == UNKNOWN and i % 5 < 3 else outcome
        rows.append((f"{topic}:{i}", first, outcome))
    return rows


def main() -> None:
    endpoint, out = sys.argv[1], sys.argv[2]
    conf = ClientConfiguration(endpoint, Credentials())
    lock = threading.Lock()
    state: dict[str, dict[str, Any]] = {}
    producers = {}
    for topic in (HEALTHY, UNKNOWN):
        p = Producer(conf, (topic,), checker=Checker(state, lock))
        p.startup()
        producers[topic] = p
    plans = {t: plan(t) for t in producers}
    started = time.time()
    for i in range(PER_GROUP):
        for topic, p in producers.items():
            key, first, outcome = plans[topic][i]
            with lock:
                state[key] = {
                    "topic": topic,
                    "first": first,
                    "outcome": outcome,
                    "ended": False,
                    "unknown_answered": False,
                    "checks": [],
                }
            msg = Message()
            msg.topic, msg.body, msg.tag = topic, key.encode(), "h26"
            tx = p.begin_transaction()
            receipt = p.send(msg, tx)
            state[key]["msg_id"] = receipt.message_id
            if first == "commit":
                tx.commit()
            elif first == "rollback":
                tx.rollback()
            if first != "unknown":
                with lock:
                    state[key]["ended"] = True
        time.sleep(0.25)
        if (i + 1) % BURST == 0 and i + 1 < PER_GROUP:
            time.sleep(GAP_S)
    sent = time.time()
    time.sleep(SETTLE_S)
    for p in producers.values():
        p.shutdown()
    truth: dict[str, Any] = {"started": started, "sent": sent, "topics": {}}
    for topic in producers:
        txs = [t for t in state.values() if t["topic"] == topic]
        checks = [c for t in txs for c in t["checks"]]
        truth["topics"][topic] = {
            "transactions": len(txs),
            "first_phase": dict(Counter(t["first"] for t in txs)),
            "outcome": dict(Counter(t["outcome"] for t in txs)),
            "checks": len(checks),
            "checked_transactions": sum(1 for t in txs if t["checks"]),
            "checks_of_ended_transactions": sum(1 for c in checks if c["already_ended"]),
            "ended_transactions_checked": sum(
                1 for t in txs if any(c["already_ended"] for c in t["checks"])
            ),
            "unknown_answers": sum(1 for c in checks if c["answer"] == "unknown"),
            "by_msg_id": {
                t["msg_id"]: {
                    "key": k,
                    "first": t["first"],
                    "outcome": t["outcome"],
                    "answers": [c["answer"] for c in t["checks"]],
                }
                for k, t in state.items()
                if t["topic"] == topic
            },
        }
    with open(out, "w") as f:
        json.dump(truth, f, indent=1, sort_keys=True)
    for topic, t in truth["topics"].items():
        print(topic, {k: v for k, v in t.items() if k != "by_msg_id"})


if __name__ == "__main__":
    main()
