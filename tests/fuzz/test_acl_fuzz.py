"""Fuzzing keeps up with ACL (issue 16.4): the in-process ``acl`` target and the ACL-hooked framing
loop, and live sockets against a broker started with the harness's plain_acl.yml (``run.py --acl``):
no crash, no hang, the signing well-behaved client keeps working and everything it stored reads back."""

from __future__ import annotations

import os
import random
from typing import Any

from txmsg_broker.fuzz.inputs import (
    FUZZ_ACL,
    FUZZ_CREDENTIALS,
    RandomChooser,
    frame,
    generate,
    run_target,
)
from txmsg_broker.fuzz.live import GoodSender, LogWatcher, exchange, healthy, problems, read_back
from txmsg_broker.testing import wait_until

EXAMPLES = int(os.environ.get("TXMSG_FUZZ_EXAMPLES", "300"))


def test_acl_and_stream_targets_hold_their_properties() -> None:
    rng = RandomChooser(random.Random(16))
    counts = {"acl": 0, "stream": 0}
    while min(counts.values()) < EXAMPLES:
        target, data = generate(rng)
        if target in counts:
            counts[target] += 1
            assert run_target(target, data) == "ok", (target, data.hex())


def test_live_broker_with_acl_survives_fuzzed_connections(txmsg_broker_factory: Any) -> None:
    broker = txmsg_broker_factory(acl=FUZZ_ACL)
    good = GoodSender(broker.broker_addr, credentials=FUZZ_CREDENTIALS)
    logs = LogWatcher(broker.log_dir)
    good.start()
    try:
        wait_until(
            lambda: good.sent or good.failures, timeout=20, message="the first signed good send"
        )
        for index in range(EXAMPLES):
            rng = random.Random(1_000_003 * 16 + index)
            addr = broker.namesrv_addr if rng.randrange(5) == 0 else broker.broker_addr
            data = frame(RandomChooser(rng))
            result = exchange(addr, data, deadline=10.0, credentials=FUZZ_CREDENTIALS)
            assert not problems(data, result), (problems(data, result), data.hex())
            assert not logs.new_findings(), data.hex()
            assert not good.failures, good.failures
    finally:
        good.stop()
    assert not good.failures, good.failures
    assert not healthy(broker.namesrv_addr, broker.broker_addr, credentials=FUZZ_CREDENTIALS)
    stored = read_back(broker.broker_addr, good.topic, credentials=FUZZ_CREDENTIALS)
    assert all(stored.get(body) == queue_id for body, queue_id in good.sent.items())
    # an unsigned read-back is refused: the fuzzing did not switch the ACL off
    assert healthy(broker.namesrv_addr, broker.broker_addr)
