"""SIGKILL the settlement service mid-park and restart it: nothing lost, reordered or doubled
(on every installed backend).

The consumer runs as a child process (``kill_consumer.py``).  Its extra alert hook holds the
consumer thread right after the poisoned order's park committed; the test kills the process
there - before the message is acknowledged and before the order's later events are parked - and
starts a new one.  The broker hands the parked message again (parked once, not twice), the later
events are parked behind it, the other orders complete (their redelivered events absorbed by the
dedup rows), and the replay applies the parked order once, in order.  Every check reads the
databases."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import create_group, create_topic, wait_until

from txmsg import TxMsgConfig
from txmsg.sqla import parking
from txmsg_samples.aftersales import settlement
from txmsg_samples.aftersales.app import aftersales_app, aftersales_service
from txmsg_samples.aftersales.events import KINDS, TOPIC, AfterSalesEvent
from txmsg_samples.aftersales.tests.conftest import CONNECT, Dbs
from txmsg_samples.aftersales.tests.scenario import (
    NEW_MERCHANT,
    POISONED,
    applied_seq,
    assert_applied_once_in_order,
    open_accounts,
    others_done,
    run_cases,
)
from txmsg_samples.aftersales.tests.test_e2e import replay_with_cli, write_config

ROOT = Path(__file__).resolve().parents[3]
#: the invisible time of the rocketmq5 children's receives (a RocketMQ 5 proxy's minimum)
INVISIBLE_S = 10


class Child:
    """The settlement consumer process; its output goes to a log file for failures."""

    def __init__(self, config_file: Path, log: Path, ready: Path | None = None) -> None:
        env = {
            **os.environ,
            "TXMSG_CONFIG": str(config_file),
            "PYTHONPATH": str(ROOT),
            # rocketmq5: the dead consumer's message comes back after 10 s, not 60 (see
            # kill_consumer.py); the remoting backend ignores it
            "AFTERSALES_TEST_INVISIBLE_S": str(INVISIBLE_S),
        }
        env.pop("AFTERSALES_TEST_READY", None)
        if ready is not None:
            env["AFTERSALES_TEST_READY"] = str(ready)
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "txmsg_samples.aftersales.tests.kill_consumer"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.stop(signal.SIGKILL)


def parked_seqs(dbs: Dbs) -> list[int]:
    parked = parking.parked_messages(dbs.settlement, settlement.GROUP, POISONED)
    return [AfterSalesEvent.from_body(p.message.body).seq for p in parked]


@pytest.mark.slow
@pytest.mark.wall_clock  # the dead consumer's hold (queue lock, invisible time) runs out in real time
def test_kill_mid_park_then_restart(
    backend_name: str, broker: Any, dbs: Dbs, tmp_path: Path, children: list[Child]
) -> None:
    create_topic(broker.namesrv_addr, TOPIC, queues=2, message_type="FIFO")
    create_group(broker.namesrv_addr, settlement.GROUP, orderly=True)  # RocketMQ 5: FIFO pops
    connect = CONNECT[backend_name](broker, tmp_path)
    config_file = write_config(
        tmp_path / "txmsg.toml", backend_name, connect, dbs, tmp_path / "alerts.jsonl"
    )
    open_accounts(dbs.settlement)
    ready = tmp_path / "parked.ready"
    log = tmp_path / "consumer.log"
    first = Child(config_file, log, ready)
    children.append(first)

    with aftersales_app(TxMsgConfig(backend=backend_name, **connect), dbs.cases) as pub:
        service = aftersales_service(pub, dbs.cases)
        run_cases(service)
        wait_until(
            ready.exists,
            timeout=90,
            message=lambda: f"the consumer to park {POISONED}; its output:\n{first.output()}",
        )
        assert ready.read_text() == POISONED
        first.stop(signal.SIGKILL)
        assert first.proc.returncode == -signal.SIGKILL

        # the moment of the kill: the key and its first event parked, nothing behind it yet
        assert parked_seqs(dbs) == [1]
        assert POISONED not in applied_seq(dbs.settlement)

        second = Child(config_file, log)
        children.append(second)
        # first the dead client's hold runs out: RocketMQ 4 its queue locks
        # (rebalanceLockMaxLiveTime: 60 s, 25 s on the test broker), RocketMQ 5 its received
        # messages' invisible time (60 s, INVISIBLE_S here)
        wait_until(
            lambda: others_done(dbs.settlement) and len(parked_seqs(dbs)) == len(KINDS),
            timeout=150,
            message=lambda: (
                f"the restarted consumer to finish ({applied_seq(dbs.settlement)}, "
                f"parked {parked_seqs(dbs)}); its output:\n{second.output()}"
            ),
        )
        assert parked_seqs(dbs) == [1, 2, 3]  # the redelivered first event was not parked twice
        assert POISONED not in applied_seq(dbs.settlement)

        with dbs.settlement() as s, s.begin():
            settlement.open_account(s, NEW_MERCHANT)
        replay_with_cli(config_file, POISONED)
        assert applied_seq(dbs.settlement)[POISONED] == len(KINDS)
        assert parking.parked_keys(dbs.settlement) == []
        second.stop()
    assert second.proc.returncode == 0, second.output()
    assert_applied_once_in_order(dbs.cases, dbs.settlement)
