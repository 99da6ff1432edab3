"""The transaction outcome table, written with ONLY the official RocketMQ 5 Python client.

Run as ``python outcome_script.py ENDPOINT TOPIC CHECK_INTERVAL_S`` against any 5.x gRPC endpoint (the
embedded broker's ``--grpc-port`` or a real proxy). Sends one transactional message per row, resolves
it as the row says (commit / rollback at once, or leaves it pending and answers check-backs in order),
waits until every expected check-back happened plus two check intervals, and prints one JSON line:
``{"sent": {row: message_id}, "checks": {row: n}}``. Deliveries are observed by the caller.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter

from rocketmq import (
    ClientConfiguration,
    Credentials,
    Message,
    Producer,
    TransactionChecker,
    TransactionResolution,
)

C, R, U = (
    TransactionResolution.COMMIT,
    TransactionResolution.ROLLBACK,
    TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
)
#: row -> (what the sender does: "commit" / "rollback" / None = nothing, answers to successive checks)
TABLE: dict[str, tuple[str | None, list[int]]] = {
    "COMMIT": ("commit", []),
    "ROLLBACK": ("rollback", []),
    "U_COMMIT": (None, [C]),
    "U_ROLLBACK": (None, [R]),
    "UU_COMMIT": (None, [U, C]),
    "U_FOREVER": (None, [U, U, U, U, U, U]),
}
EXPECTED_CHECKS = {
    "COMMIT": 0,
    "ROLLBACK": 0,
    "U_COMMIT": 1,
    "U_ROLLBACK": 1,
    "UU_COMMIT": 2,
    "U_FOREVER": 3,
}
DELIVERED = {"COMMIT", "U_COMMIT", "UU_COMMIT"}


class TableChecker(TransactionChecker):
    def __init__(self) -> None:
        self.checks: Counter[str] = Counter()
        self.lock = threading.Lock()

    def check(self, message: Message) -> int:
        (key,) = message.keys
        with self.lock:
            index = self.checks[key]
            self.checks[key] += 1
        answers = TABLE[key][1]
        return answers[min(index, len(answers) - 1)]


def main(endpoint: str, topic: str, interval_s: float) -> int:
    checker = TableChecker()
    producer = Producer(
        ClientConfiguration(endpoint, Credentials(), request_timeout=10), (topic,), checker
    )
    producer.startup()
    sent: dict[str, str] = {}
    try:
        for key, (action, _answers) in TABLE.items():
            message = Message()
            message.topic = topic
            message.body = f"body-{key}".encode()
            message.tag = "TagA"
            message.keys = key
            transaction = producer.begin_transaction()
            receipt = producer.send(message, transaction)
            sent[key] = receipt.message_id
            if action == "commit":
                transaction.commit()
            elif action == "rollback":
                transaction.rollback()
        expected = {k: v for k, v in EXPECTED_CHECKS.items() if v}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with checker.lock:
                if all(checker.checks[k] >= v for k, v in expected.items()):
                    break
            time.sleep(0.1)
        time.sleep(2 * interval_s + 0.5)  # nothing else may be checked
        with checker.lock:
            print(json.dumps({"sent": sent, "checks": dict(checker.checks)}), flush=True)
    finally:
        producer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
