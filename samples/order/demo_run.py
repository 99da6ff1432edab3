"""One demo run: embedded broker, the order sample with injected faults, seeded orders."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from samples.order import cart
from samples.order.events import TOPIC
from samples.order.faults import FaultPlan, FaultyPaymentListener, Tally, lose_first_ack
from samples.order.orders import ORDER_GROUP, PaymentListener, create_order
from samples.order.settings import OrderSampleSettings
from samples.order.verify import Databases
from txmsg import LocalTransactionState, TxMsgConfig

if TYPE_CHECKING:
    from samples.order.demo import DemoOptions
    from samples.order.wiring import OrderSample


def create_transaction_topic(name_server: str, topic: str, queues: int = 4) -> None:
    """``txmsg topic create TOPIC --type TRANSACTION`` (``mqadmin updateTopic`` on a real
    cluster): RocketMQ 5 brokers only take transactional messages on TRANSACTION topics."""
    done = subprocess.run(
        [sys.executable, "-m", "txmsg_broker", "topic", "create", topic]
        + ["--namesrv", name_server, "--type", "TRANSACTION", "--queues", str(queues)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"could not create topic {topic}: {done.stderr or done.stdout}")


class DemoRun:
    """Owns the broker process, the sample and the seeded data of one ``txmsg demo``."""

    def __init__(self, options: DemoOptions, workdir: Path, broker: Any = None) -> None:
        """``broker``: an already running broker (e.g. the ``txmsg_broker`` test fixture) with
        check timings like the options'; None starts one for this run."""
        self.options = options
        self._own_broker = broker is None
        self.workdir = workdir
        self.order_ids = [f"order-{i:05d}" for i in range(options.orders)]
        self.plan = FaultPlan.draw(
            self.order_ids,
            fail_rate=options.fail_rate,
            slow_rate=options.slow_rate,
            lose_ack_rate=options.lose_ack_rate,
            seed=options.seed,
            # long enough to outlive answer_within and the first check-back
            slow_seconds=(
                options.answer_within + 0.5,
                options.answer_within + 0.5 + 2 * options.transaction_timeout_ms / 1000,
            ),
        )
        self.tally = Tally()
        self.broker: Any = broker
        self.sample: OrderSample | None = None
        self.name_server = ""
        self._dbs: Databases | None = None

    @property
    def dbs(self) -> Databases:
        assert self._dbs is not None, "start() first"
        return self._dbs

    def start(self) -> None:
        if self.broker is None:
            self.broker = self._spawn_broker()
        self.name_server = self.broker.namesrv_addr
        self._start_services()

    def _spawn_broker(self) -> Any:
        from txmsg_broker.app import EmbeddedBroker

        opts = self.options
        return EmbeddedBroker.spawn(
            self.workdir / "broker" / "data",
            self.workdir / "broker" / "logs",
            transaction_timeout_ms=opts.transaction_timeout_ms,
            check_interval_ms=opts.check_interval_ms,
            check_max=opts.check_max,
            delay_scale=0.01,  # consumer retries after 0.1 s instead of 10 s
        )

    def _start_services(self) -> None:
        from samples.order.wiring import OrderSample

        opts = self.options
        create_transaction_topic(self.name_server, TOPIC)
        config = TxMsgConfig.model_validate(
            {
                "name_server": self.name_server,
                "client_log_dir": str(self.workdir / "rocketmq-client"),
                "producer": {"group": ORDER_GROUP},
                "listeners": {ORDER_GROUP: {"concurrency": 4}},
                "close_timeout": 20.0,
            }
        )
        db = self.workdir / "db"
        settings = OrderSampleSettings(
            orders_db=f"sqlite:///{db / 'orders.db'}",
            points_db=f"sqlite:///{db / 'points.db'}",
            logistics_db=f"sqlite:///{db / 'logistics.db'}",
            cart_db=f"sqlite:///{db / 'cart.db'}",
            answer_within=opts.answer_within,
        )
        plan, tally = self.plan, self.tally

        def listener(sessions: sessionmaker[Session]) -> PaymentListener:
            return FaultyPaymentListener(
                sessions,
                plan=plan,
                tally=tally,
                answer_within=opts.answer_within,
                in_flight_timeout=opts.in_flight_timeout,
                background_workers=opts.background_workers,
            )

        self.sample = OrderSample(
            config,
            settings,
            listener_factory=listener,
            consumer_wrapper=lambda group, consumer: lose_first_ack(consumer, group, plan, tally),
        )
        self._dbs = Databases(
            self.sample.orders_db,
            self.sample.points_db,
            self.sample.logistics_db,
            self.sample.cart_db,
        )
        self._seed()
        self.sample.start()

    def _seed(self) -> None:
        """N orders of N/5 users, 1-3 unique SKUs each, all in the users' carts, plus one item
        per user that nobody orders (it must survive every checkout)."""
        rng = random.Random(self.options.seed)
        users = [f"user-{i:04d}" for i in range(max(1, len(self.order_ids) // 5))]
        with self.dbs.orders() as orders, orders.begin(), self.dbs.cart() as carts, carts.begin():
            for user in users:
                cart.add_to_cart(carts, user, f"wishlist-{user}")
            for oid in self.order_ids:
                user = rng.choice(users)
                skus = [f"{oid}-sku{k}" for k in range(rng.randint(1, 3))]
                create_order(orders, oid, user, rng.randint(199, 49_999), skus)
                for sku in skus:
                    cart.add_to_cart(carts, user, sku)

    def pay(self, order_id: str) -> LocalTransactionState | None:
        assert self.sample is not None
        result = self.sample.orders.pay(order_id)
        state: LocalTransactionState | None = result.local_state
        return state

    def close(self) -> None:
        try:
            if self.sample is not None:
                self.sample.close(20.0)
        finally:
            if self.broker is not None and self._own_broker:
                self.broker.stop()
