"""Make the logs in this directory: a slow-but-sound producer group on a real RocketMQ 5.3.3.

Not run by the tests (they read the logs and the ``truth-*.json`` this wrote).  Needs a real 5.3.3
broker + proxy with the topics created (README.md has the commands) and the official 5.x Python
client (``rocketmq-python-client``)::

    python make_logs.py 127.0.0.1:28081 OUT.json

Two topics, one producer per topic (a 5.x proxy logs transactions under the topic), both sending
at a steady rate over ``DURATION_S`` (interleaved, no bursts):

* ``h35-demo``: 200 transactions of a normal service: 7 (3.5 %) are left UNKNOW at send (a 5.x
  client then sends nothing) and answered COMMIT at their check-back; 20 are rolled back at once,
  the rest committed at once.  ``check`` answers from the transaction's real outcome.
* ``h35-slow``: 74 transactions, 64 (86 %) left UNKNOW at send (the local transaction is slower
  than the first phase); ``check`` sleeps 0.5 s and answers COMMIT, at the first check already
  (it never answers UNKNOW).  The other 10 are committed at once.

Every check-back the producers receive is recorded with what it answered and whether the
transaction had already ended when it came (at send, or by an earlier check answer), so the truth
says per topic how many transactions, first-phase answers, check-backs, UNKNOW answers and
check-backs of ended transactions.
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

DEMO, SLOW = "h35-demo", "h35-slow"
COUNT = {DEMO: 200, SLOW: 74}
DURATION_S = 75.0
"""Each topic's sends are spread evenly over this long (demo every 0.375 s, slow every ~1 s)."""
SLOW_CHECK_S = 0.5
"""The slow group's checker takes this long before it answers (COMMIT)."""
SETTLE_S = 40.0
"""After the last send: 3 checks 2 s apart plus the op batch (3 s) and slack."""

ANSWER = {
    "unknown": TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
    "commit": TransactionResolution.COMMIT,
    "rollback": TransactionResolution.ROLLBACK,
}


class Checker(TransactionChecker):
    """Answers the transaction's real outcome (after ``delay`` seconds); never UNKNOW."""

    def __init__(
        self, state: dict[str, dict[str, Any]], lock: threading.Lock, delay: float = 0.0
    ) -> None:
        self.state = state
        self.lock = lock
        self.delay = delay

    def check(self, message: Message) -> int:
        key = message.body.decode()
        came = time.time()
        with self.lock:
            ended = self.state[key]["ended"]
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            tx = self.state[key]
            answer = tx["outcome"]
            tx["ended"] = True
            tx["checks"].append({"at": came, "already_ended": ended, "answer": answer})
        return ANSWER[answer]


def plan(topic: str) -> list[tuple[str, str, str]]:
    """(key, first-phase answer, outcome) per transaction."""
    rows = []
    for i in range(COUNT[topic]):
        if topic == DEMO:
            outcome = "rollback" if i % 10 == 5 else "commit"
            first = "unknown" if i % 28 == 14 and i < 196 else outcome
        else:
            outcome = "commit"
            first = "commit" if i % 7 == 3 and i < 70 else "unknown"
        rows.append((f"{topic}:{i}", first, outcome))
    return rows


def main() -> None:
    endpoint, out = sys.argv[1], sys.argv[2]
    conf = ClientConfiguration(endpoint, Credentials())
    lock = threading.Lock()
    state: dict[str, dict[str, Any]] = {}
    producers = {}
    for topic in (DEMO, SLOW):
        delay = SLOW_CHECK_S if topic == SLOW else 0.0
        p = Producer(conf, (topic,), checker=Checker(state, lock, delay))
        p.startup()
        producers[topic] = p
    plans = {t: plan(t) for t in producers}
    schedule = sorted(
        (i * DURATION_S / COUNT[topic], topic, i)
        for topic in producers
        for i in range(COUNT[topic])
    )
    started = time.time()
    for at, topic, i in schedule:
        wait = started + at - time.time()
        if wait > 0:
            time.sleep(wait)
        key, first, outcome = plans[topic][i]
        with lock:
            state[key] = {
                "topic": topic,
                "first": first,
                "outcome": outcome,
                "ended": False,
                "checks": [],
            }
        msg = Message()
        msg.topic, msg.body, msg.tag = topic, key.encode(), "h35"
        tx = producers[topic].begin_transaction()
        receipt = producers[topic].send(msg, tx)
        with lock:
            state[key]["msg_id"] = receipt.message_id
            state[key]["sent_at"] = time.time()
        if first == "commit":
            tx.commit()
        elif first == "rollback":
            tx.rollback()
        if first != "unknown":
            with lock:
                state[key]["ended"] = True
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
            "unknown_at_send_checked": sum(
                1 for t in txs if t["first"] == "unknown" and t["checks"]
            ),
            "by_msg_id": {
                t["msg_id"]: {
                    "key": k,
                    "first": t["first"],
                    "outcome": t["outcome"],
                    "answers": [c["answer"] for c in t["checks"]],
                    "checks": [
                        {
                            "after_send_s": round(c["at"] - t["sent_at"], 3),
                            "already_ended": c["already_ended"],
                            "answer": c["answer"],
                        }
                        for c in t["checks"]
                    ],
                }
                for k, t in state.items()
                if t["topic"] == topic
            },
        }
    with open(out, "w") as f:
        json.dump(truth, f, indent=1, sort_keys=True)
    print(
        "duration",
        round(sent - started, 1),
        "s sending,",
        round(time.time() - started, 1),
        "s in all",
    )
    for topic, t in truth["topics"].items():
        print(topic, {k: v for k, v in t.items() if k != "by_msg_id"})


if __name__ == "__main__":
    main()
