"""Fault injection for the demo: which orders fail, answer late, or lose their consumer ack.

Kept out of the sample's business code on purpose: the demo subclasses the real listener and
wraps the real consumers, so what it proves holds for the code a newcomer copies.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from txmsg.message import Message
from txmsg.states import LocalTransactionState
from txmsg_samples.order.events import OrderPaid
from txmsg_samples.order.orders import PaymentListener


class InjectedFailure(RuntimeError):
    """The demo's stand-in for a failing local transaction (e.g. the ledger is down)."""


class SimulatedCrash(RuntimeError):
    """The demo's stand-in for a consumer that committed but crashed before acknowledging."""


@dataclass(frozen=True)
class FaultPlan:
    """Which orders get which fault; decided up front from a seed so a run can be repeated."""

    fail: frozenset[str] = frozenset()
    slow: frozenset[str] = frozenset()
    lose_ack: frozenset[str] = frozenset()
    slow_seconds: tuple[float, float] = (0.8, 2.0)
    seed: int = 0

    @classmethod
    def draw(
        cls,
        order_ids: list[str],
        *,
        fail_rate: float,
        slow_rate: float,
        lose_ack_rate: float,
        seed: int,
        slow_seconds: tuple[float, float] = (0.8, 2.0),
    ) -> FaultPlan:
        for name, rate in (
            ("fail-rate", fail_rate),
            ("slow-rate", slow_rate),
            ("lose-ack-rate", lose_ack_rate),
        ):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"--{name} must be between 0 and 1, not {rate}")
        rng = random.Random(seed)  # noqa: S311 - seeded fault plan, reproducible on purpose
        fail = frozenset(o for o in order_ids if rng.random() < fail_rate)
        slow = frozenset(o for o in order_ids if rng.random() < slow_rate)
        lose_ack = frozenset(o for o in order_ids if o not in fail and rng.random() < lose_ack_rate)
        return cls(fail, slow, lose_ack, slow_seconds, seed)

    def delay_for(self, order_id: str) -> float:
        if order_id not in self.slow:
            return 0.0
        low, high = self.slow_seconds
        return random.Random(f"{self.seed}:{order_id}").uniform(low, high)  # noqa: S311 - seeded, reproducible


@dataclass
class Tally:
    """Thread-safe record of what the listener answered, per transaction key."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    execute: dict[str, LocalTransactionState] = field(default_factory=dict)
    checks: dict[str, list[LocalTransactionState]] = field(default_factory=dict)
    order_of_key: dict[str, str] = field(default_factory=dict)
    crashes: Counter[str] = field(default_factory=Counter)
    foreign: int = 0
    """Consumed messages of other runs, acknowledged and skipped (see demo_run.only_orders)."""

    def executed(self, key: str, order_id: str, state: LocalTransactionState) -> None:
        with self.lock:
            self.execute[key] = state
            self.order_of_key[key] = order_id

    def checked(self, key: str, state: LocalTransactionState) -> None:
        with self.lock:
            self.checks.setdefault(key, []).append(state)

    def resolved_by_check(self) -> dict[str, LocalTransactionState]:
        """Keys whose local transaction answered UNKNOW and a check-back then settled."""
        with self.lock:
            out: dict[str, LocalTransactionState] = {}
            for key, state in self.execute.items():
                if state is not LocalTransactionState.UNKNOW:
                    continue
                final = [
                    s for s in self.checks.get(key, []) if s is not LocalTransactionState.UNKNOW
                ]
                if final:
                    out[key] = final[-1]
            return out


class FaultyPaymentListener(PaymentListener):
    """The sample's PaymentListener with the demo's faults injected around the business change."""

    def __init__(self, *args: Any, plan: FaultPlan, tally: Tally, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.tally = tally

    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
        order_id = str(arg)
        delay = self.plan.delay_for(order_id)
        if delay:
            # A slow call before the first statement (see txmsg.sqla.engine on SQLite locking).
            time.sleep(delay)
        super().execute_in_transaction(session, message, arg)
        if order_id in self.plan.fail:
            session.flush()  # the order row really changed; the rollback must undo it
            raise InjectedFailure(f"injected failure for {order_id}")

    def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
        state = super().execute_local(message, arg)
        self.tally.executed(message.transaction_key or "", str(arg), state)
        return state

    def check_local(self, message: Message) -> LocalTransactionState:
        state = super().check_local(message)
        self.tally.checked(message.transaction_key or "", state)
        return state


def lose_first_ack(
    consumer: Callable[[Message], Any], group: str, plan: FaultPlan, tally: Tally
) -> Callable[[Message], None]:
    """Wrap an idempotent consumer: for planned orders, after the first successful apply, raise as
    if the process died before acknowledging, so the broker redelivers the same message."""
    seen: set[str] = set()
    lock = threading.Lock()

    def handler(message: Message) -> None:
        consumer(message)
        order_id = OrderPaid.from_message(message).order_id
        if order_id not in plan.lose_ack:
            return
        with lock:
            if order_id in seen:
                return
            seen.add(order_id)
        with tally.lock:
            tally.crashes[group] += 1
        raise SimulatedCrash(f"{group}: lost the ack of {order_id} after committing")

    handler.__name__ = getattr(consumer, "__name__", f"{group}_handler")
    return handler
