"""The chaos run's child processes: ``python -m benchmarks.chaos.roles producer|consumer ...``.

Each is the order sample's real code in its own OS process, so ``kill -9`` hits what a deployment
runs:

* **producer** - an instance of the order service (group ``order-tx``): creates orders and pays
  them with ``OrderService.pay`` from a few threads, journaling each attempt.  Some local
  transactions fail and some are slow (decided from the order id, so every incarnation agrees).
  On start it re-pays its own orders that a previous incarnation left unfinished.  SIGUSR1 stops
  paying but keeps the process up to answer check-backs; SIGTERM closes it.
  After a payment answered COMMIT it sends the order's ordered events (``send_orderly``, sharding
  key = order id; :mod:`benchmarks.chaos.tracking`).
* **consumer** - one instance of points, logistics or cart: the sample's idempotent consumer; or
  of tracking: the ordered events' orderly, idempotent consumer; or of ledger: the outbox stream's
  orderly, idempotent consumer (:mod:`benchmarks.chaos.outbox_stream`).
* **outbox-writer** - an instance of the bank service: transfers committed with their outbox
  messages; writer 0 runs the relay in its process.  SIGUSR1 stops writing (the relay goes on).

Both print ``READY`` once started; the orchestrator reads it from their log.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import click
from injector import Injector
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from txmsg_samples.order import cart
from txmsg_samples.order.events import TOPIC
from txmsg_samples.order.keys import ORDER_GROUP, CartDb, OrdersDb
from txmsg_samples.order.orders import (
    CREATED,
    Order,
    OrderService,
    PaymentListener,
    create_order,
)
from txmsg_samples.order.settings import OrderSampleSettings
from txmsg_samples.order.wiring import CONSUMERS, OrderSampleModule

from benchmarks.chaos import outbox_stream, tracking
from benchmarks.chaos.databases import PaymentAttempt, finish_attempt, start_attempt
from benchmarks.chaos.settings import ChaosSettings
from txmsg import LocalTransactionState, TxMsg, TxMsgConfig, TxMsgModule
from txmsg.message import Message
from txmsg.sqla import create_engine, make_session_factory

log = logging.getLogger("txmsg.chaos")
STOP_PAYING = "stop-paying"
"""File in the workdir: producers (re)started after it exists only answer check-backs."""
USERS = 20


class InjectedFailure(RuntimeError):
    """Stand-in for a failing local transaction (the payment ledger refused)."""


def fault_of(settings: ChaosSettings, order_id: str) -> tuple[str, float]:
    """``("fail" | "stuck" | "slow" | "ok", delay)``: a pure function of the seed and the order id
    (``p<producer>-<pid>-<thread>-<sequence>``; the sequence picks the stuck ones)."""
    rng = random.Random(f"{settings.seed}:{order_id}")
    _, _, sequence = order_id.rpartition("-")
    every = settings.stuck_every
    if every and sequence.isdigit() and int(sequence) % every == every - 1:
        return "stuck", rng.uniform(*settings.stuck_seconds)
    roll = rng.random()
    if roll < settings.fail_rate:
        return "fail", 0.0
    if roll < settings.fail_rate + settings.slow_rate:
        return "slow", rng.uniform(*settings.slow_seconds)
    return "ok", 0.0


class ChaosPaymentListener(PaymentListener):
    """The sample's listener with the run's failing and slow local transactions."""

    def __init__(self, sessions: sessionmaker[Session], settings: ChaosSettings) -> None:
        super().__init__(
            sessions,
            answer_within=settings.answer_within,
            grace_period=settings.grace_period,
            in_flight_timeout=settings.in_flight_timeout,
        )
        self.settings = settings

    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
        fault, delay = fault_of(self.settings, str(arg))
        if delay:
            time.sleep(delay)  # before the first statement (SQLite write lock, see txmsg.sqla)
        super().execute_in_transaction(session, message, arg)
        if fault == "fail":
            session.flush()  # the row really changed; the rollback must undo it
            raise InjectedFailure(f"injected failure for {arg}")


def _client_config(settings: ChaosSettings, name: str, extra: dict[str, Any]) -> TxMsgConfig:
    backend = (
        {"backend": "rocketmq5", "endpoints": settings.endpoints}
        if settings.backend == "rocketmq5"
        else {"backend": settings.backend}
    )
    return TxMsgConfig.model_validate(
        {
            **backend,
            "name_server": settings.name_server,
            "client_log_dir": str(settings.workdir / "rocketmq-client" / name),
            "close_timeout": 5.0,
            **extra,
        }
    )


def _sample_settings(settings: ChaosSettings) -> OrderSampleSettings:
    urls = settings.database_urls
    return OrderSampleSettings(
        orders_db=urls["orders"],
        points_db=urls["points"],
        logistics_db=urls["logistics"],
        cart_db=urls["cart"],
        answer_within=settings.answer_within,
        grace_period=settings.grace_period,
        in_flight_timeout=settings.in_flight_timeout,
    )


class Producer:
    """One order-service instance: pays orders until told to stop."""

    def __init__(self, settings: ChaosSettings, index: int, paying: threading.Event) -> None:
        self.settings = settings
        self.name = f"producer-{index}"
        self.prefix = f"p{index}-"
        config = _client_config(
            settings,
            f"{self.name}-{os.getpid()}",
            {
                "producer": {"group": ORDER_GROUP},
                "listeners": {ORDER_GROUP: {"concurrency": 4}},
            },
        )
        self.app = TxMsg(config)
        self.module = OrderSampleModule(_sample_settings(settings))
        self.injector = Injector([self.module, TxMsgModule(self.app, groups=[ORDER_GROUP])])
        self.orders_db = self.injector.get(OrdersDb)
        self.cart_db = self.injector.get(CartDb)
        self.app.add_transactional_listener(
            ChaosPaymentListener(self.orders_db, settings),
            group=ORDER_GROUP,
            topics=[TOPIC],
            execute_exception_state=LocalTransactionState.ROLLBACK,
        )
        self.paying = paying
        self.service: OrderService | None = None

    def start(self) -> None:
        self.app.start()
        self.service = self.injector.get(OrderService)

    def unfinished(self) -> list[str]:
        """This producer's CREATED orders whose last attempt never learned an outcome (the
        process died) or failed to reach the broker."""
        with self.orders_db() as session:
            created = set(
                session.scalars(
                    select(Order.id).where(
                        Order.status == CREATED, Order.id.startswith(self.prefix)
                    )
                )
            )
            last: dict[str, str | None] = {}
            for attempt in session.scalars(
                select(PaymentAttempt)
                .where(PaymentAttempt.order_id.in_(created))
                .order_by(PaymentAttempt.id)
            ):
                last[attempt.order_id] = attempt.outcome
        return sorted(oid for oid, outcome in last.items() if outcome in (None, "ERROR", "UNKNOW"))

    def pay(self, order_id: str) -> str:
        if self.service is None:
            raise RuntimeError(f"{self.name}: pay() before the payment service was started")
        attempt = start_attempt(self.orders_db, order_id, self.name)
        try:
            result = self.service.pay(order_id)
            state = result.local_state
            outcome = state.name if state is not None else "UNKNOW"
        except Exception as exc:  # noqa: BLE001 - broker down, send timeout, database busy: journaled, retried
            log.warning("%s: paying %s failed: %s", self.name, order_id, exc)
            outcome = "ERROR"
        finish_attempt(self.orders_db, attempt, outcome)
        return outcome

    def new_order(self, rng: random.Random, order_id: str) -> None:
        """The user fills a cart (cart database), then places the order (orders database)."""
        user = f"user-{rng.randrange(USERS):03d}"
        skus = [f"{order_id}-sku{k}" for k in range(rng.randint(1, 3))]
        with self.cart_db() as carts, carts.begin():
            for sku in skus:
                cart.add_to_cart(carts, user, sku)
        with self.orders_db() as orders, orders.begin():
            create_order(orders, order_id, user, rng.randint(199, 49_999), skus)

    def run_thread(self, thread: int) -> None:
        rng = random.Random(f"{self.settings.seed}:{self.name}:{os.getpid()}:{thread}")
        seq = 0
        while self.paying.is_set():
            order_id = f"{self.prefix}{os.getpid()}-{thread}-{seq:05d}"
            seq += 1
            try:
                self.new_order(rng, order_id)
            except Exception as exc:  # noqa: BLE001 - a paying thread keeps going until the run ends
                log.warning("%s: could not create %s: %s", self.name, order_id, exc)
                time.sleep(0.5)
                continue
            outcome = self.pay(order_id)
            if outcome == "COMMIT":
                tracking.send_events(
                    self.app.producer(ORDER_GROUP), self.orders_db, order_id, self.name
                )
            elif outcome == "ERROR":
                time.sleep(0.5)  # the broker is probably restarting
            time.sleep(self.settings.pay_interval)

    def close(self) -> None:
        self.app.close(5.0)
        self.module.dispose()


def _ready(what: str) -> None:
    print(f"READY {what} pid={os.getpid()}", flush=True)


@click.group()
def main() -> None:
    """Child processes of ``txmsg chaos`` (started by it, not by hand)."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
    )
    # the rescuer's INFO line for a discarded transaction that was rolled back: the run counts
    # its rescues from these logs (benchmarks.chaos.discards)
    logging.getLogger("txmsg.rescue").setLevel(logging.INFO)


@main.command()
@click.argument("settings_file", type=click.Path(exists=True))
@click.argument("index", type=int)
def producer(settings_file: str, index: int) -> None:
    settings = ChaosSettings.load(settings_file)
    done, paying = threading.Event(), threading.Event()
    paying.set()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGUSR1, lambda *_: paying.clear())  # "stop paying, keep answering"
    if (settings.workdir / STOP_PAYING).exists():
        paying.clear()
    instance = Producer(settings, index, paying)
    instance.start()
    _ready(instance.name)
    for order_id in instance.unfinished():
        if not instance.paying.is_set():
            break
        instance.pay(order_id)
    threads = [
        threading.Thread(target=instance.run_thread, args=(t,), daemon=True)
        for t in range(settings.producer_threads)
    ]
    for thread in threads:
        thread.start()
    done.wait()
    instance.paying.clear()
    for thread in threads:
        thread.join(10)
    instance.close()


@main.command("outbox-writer")
@click.argument("settings_file", type=click.Path(exists=True))
@click.argument("index", type=int)
def outbox_writer(settings_file: str, index: int) -> None:
    """A bank-service instance: transfers through the outbox (writer 0 runs the relay)."""
    settings = ChaosSettings.load(settings_file)
    done, going = threading.Event(), threading.Event()
    going.set()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGUSR1, lambda *_: going.clear())  # "stop writing, keep relaying"
    if (settings.workdir / STOP_PAYING).exists():
        going.clear()
    name = f"writer-{index}"
    app = TxMsg(_client_config(settings, f"{name}-{os.getpid()}", {}))
    engine = create_engine(settings.database_urls["bank"])
    sessions = make_session_factory(engine)
    outbox = outbox_stream.declare_outbox(app, sessions, relay=index == 0)
    app.start()
    _ready(name)
    writer = outbox_stream.Writer(app, sessions, outbox)
    threads = [
        threading.Thread(
            target=writer.run_thread,
            args=(name, t, settings.seed, settings.transfer_interval, going),
            daemon=True,
        )
        for t in range(settings.outbox_threads)
    ]
    for thread in threads:
        thread.start()
    done.wait()
    going.clear()
    for thread in threads:
        thread.join(10)
    app.close(5.0)
    engine.dispose()


@main.command()
@click.argument("settings_file", type=click.Path(exists=True))
@click.argument("service", type=click.Choice(["points", "logistics", "cart", "tracking", "ledger"]))
@click.argument("index", type=int)
def consumer(settings_file: str, service: str, index: int) -> None:
    settings = ChaosSettings.load(settings_file)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    orderly = service in ("tracking", "ledger")
    if service == "tracking":
        group, handler, topic = tracking.GROUP, tracking.on_order_event, tracking.TOPIC
    elif service == "ledger":
        group, handler = outbox_stream.GROUP, outbox_stream.on_ledger_event
        topic = outbox_stream.TOPIC
    else:
        group, handler, _key = next(c for c in CONSUMERS if c[0].startswith(service))
        topic = TOPIC
    config = _client_config(
        settings, f"{service}-{index}-{os.getpid()}", {"consumers": {group: {"concurrency": 4}}}
    )
    app = TxMsg(config)
    engine = create_engine(settings.database_urls[service])
    sessions = make_session_factory(engine)
    app.add_message_listener(
        handler,
        topic=topic,
        group=group,
        idempotent=True,
        session_factory=sessions,
        orderly=orderly,
    )
    app.start()
    _ready(f"{service}-{index}")
    done.wait()
    app.close(5.0)
    engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
