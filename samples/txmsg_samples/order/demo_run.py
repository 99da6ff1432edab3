"""One demo run: a broker (its own embedded one, or the user's cluster), the order sample with
injected faults, seeded orders.

On a cluster that already holds messages of earlier runs the demo must not count them: its
consumer groups are the same every run (so a re-run goes on from their stored offsets, and a
cluster with ``autoCreateSubscriptionGroup=false`` needs them created once), and whatever is
still unconsumed from an earlier, interrupted run is acknowledged and skipped: each run's order
ids carry a run id, and only this run's orders are applied.  The databases are new every run.
"""

from __future__ import annotations

import logging
import random
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker
from txmsg_broker.app import EmbeddedBroker

from txmsg import LocalTransactionState, TxMsgConfig
from txmsg.message import Message
from txmsg_samples.order import cart
from txmsg_samples.order.cluster import ensure_topics, ensure_topics_via_proxy
from txmsg_samples.order.events import OrderPaid
from txmsg_samples.order.faults import FaultPlan, FaultyPaymentListener, Tally, lose_first_ack
from txmsg_samples.order.orders import PaymentListener, create_order
from txmsg_samples.order.settings import OrderSampleSettings
from txmsg_samples.order.verify import Databases
from txmsg_samples.order.wiring import OrderSample, SampleNames

if TYPE_CHECKING:
    from txmsg_samples.order.demo import DemoOptions


def create_transaction_topic(name_server: str, topic: str, queues: int = 4) -> None:
    """``txmsg topic create TOPIC --type TRANSACTION`` (``mqadmin updateTopic`` on a real
    cluster): RocketMQ 5 brokers only take transactional messages on TRANSACTION topics."""
    done = subprocess.run(  # noqa: S603 - this interpreter, txmsg_broker and a fixed argument list
        [
            sys.executable,
            "-m",
            "txmsg_broker",
            "topic",
            "create",
            topic,
            "--namesrv",
            name_server,
            "--type",
            "TRANSACTION",
            "--queues",
            str(queues),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"could not create topic {topic}: {done.stderr or done.stdout}")


DEMO_NAMES = SampleNames(
    topic="txmsg-demo-order-paid",
    producer_group="txmsg-demo-order-tx",
    consumer_prefix="txmsg-demo-",
)
"""The demo's own names: on a shared cluster it never publishes to an application's
``order-paid`` nor answers check-backs of its ``order-tx``."""

log = logging.getLogger("txmsg.demo")


def only_orders(
    handler: Callable[[Message], Any], order_ids: set[str], tally: Tally
) -> Callable[[Message], Any]:
    """Acknowledge and skip events of orders that are not this run's (messages an earlier,
    interrupted run left unconsumed on the same cluster), so they are neither applied nor
    counted."""

    def this_run_only(message: Message) -> Any:
        try:
            order_id = OrderPaid.from_message(message).order_id
        except ValueError:
            order_id = None
        if order_id not in order_ids:
            with tally.lock:
                tally.foreign += 1
            log.info("skipped a message of another run: %s", message.message_id or message.keys)
            return None
        return handler(message)

    this_run_only.__name__ = getattr(handler, "__name__", "this_run_only")
    return this_run_only


class DemoRun:
    """Owns the broker process (if any), the sample and the seeded data of one ``txmsg demo``."""

    def __init__(self, options: DemoOptions, workdir: Path, broker: Any = None) -> None:
        """``broker``: an already running broker (e.g. the ``txmsg_broker`` test fixture) with
        check timings like the options'; None runs against ``options.name_server`` when set,
        else starts one for this run."""
        self.options = options
        self.own_broker = broker is None and not (options.name_server or options.endpoints)
        self.workdir = workdir
        self.run_id = options.run_id or secrets.token_hex(3)
        self.names = DEMO_NAMES
        self.order_ids = [f"order-{self.run_id}-{i:05d}" for i in range(options.orders)]
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
        self.endpoints = ""
        """rocketmq5: the gRPC endpoint(s) the services use (the embedded broker's, or yours)."""
        self._dbs: Databases | None = None

    @property
    def dbs(self) -> Databases:
        if self._dbs is None:
            raise RuntimeError("DemoRun.dbs: call start() first")
        return self._dbs

    def start(self) -> list[str]:
        """Start the broker (when it is ours), make sure the topic exists, start the services.
        Returns what was done about the topic; raises ClusterNotReady before anything is sent
        when the cluster refuses to create it."""
        opts = self.options
        rocketmq5 = opts.backend == "rocketmq5"
        if self.broker is None and (opts.name_server or opts.endpoints):
            self.name_server = opts.name_server or ""
            self.endpoints = opts.endpoints or ""
        else:
            if self.broker is None:
                self.broker = self._spawn_broker()
            self.name_server = self.broker.namesrv_addr
            if rocketmq5:
                self.endpoints = getattr(self.broker, "grpc_endpoint", None) or ""
                if not self.endpoints:
                    raise RuntimeError(
                        "backend rocketmq5 needs the broker's gRPC endpoint: start it with "
                        "grpc_port (the txmsg_grpc_broker fixture, `txmsg broker --grpc-port 0`)"
                    )
        if self.name_server:  # creates the topic as TRANSACTION (what 5.x needs for half messages)
            access, secret = (
                opts.client_settings.get("access_key"),
                opts.client_settings.get("secret_key"),
            )
            done = ensure_topics(  # signed with the user's keys (a cluster with ACL)
                self.name_server,
                [self.names.topic],
                credentials=(str(access), str(secret)) if access and secret else None,
            )
        else:  # a 5.x proxy alone: gRPC has no admin call, so the topic must be there already
            done = ensure_topics_via_proxy(
                self.endpoints, [self.names.topic], settings=opts.client_settings
            )
        self._start_services()
        return done

    def _spawn_broker(self) -> Any:
        opts = self.options
        return EmbeddedBroker.spawn(
            self.workdir / "broker" / "data",
            self.workdir / "broker" / "logs",
            transaction_timeout_ms=opts.transaction_timeout_ms,
            check_interval_ms=opts.check_interval_ms,
            check_max=opts.check_max,
            delay_scale=0.01,  # consumer retries after 0.1 s instead of 10 s
            # rocketmq5 talks gRPC to the broker's 5.x endpoint (a free port)
            **({"grpc_port": 0} if opts.backend == "rocketmq5" else {}),
        )

    def _start_services(self) -> None:
        opts = self.options
        names = self.names
        config = TxMsgConfig.model_validate(
            {
                "backend": opts.backend,
                **({"endpoints": self.endpoints} if self.endpoints else {}),
                **({"name_server": self.name_server} if self.name_server else {}),
                "client_log_dir": str(self.workdir / "rocketmq-client"),
                "producer": {"group": names.producer_group},
                "listeners": {names.producer_group: {"concurrency": 4}},
                "close_timeout": 20.0,
                **opts.client_settings,
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
                group=names.producer_group,
                plan=plan,
                tally=tally,
                answer_within=opts.answer_within,
                in_flight_timeout=opts.in_flight_timeout,
                background_workers=opts.background_workers,
            )

        ours = set(self.order_ids)
        self.sample = OrderSample(
            config,
            settings,
            listener_factory=listener,
            consumer_wrapper=lambda group, consumer: only_orders(
                lose_first_ack(consumer, group, plan, tally), ours, tally
            ),
            names=names,
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
        rng = random.Random(self.options.seed)  # noqa: S311 - seeded demo data, reproducible on purpose
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
        if self.sample is None:
            raise RuntimeError("DemoRun.pay: call start() first")
        result = self.sample.orders.pay(order_id)
        state: LocalTransactionState | None = result.local_state
        return state

    def close(self) -> None:
        try:
            if self.sample is not None:
                self.sample.close(20.0)
        finally:
            if self.broker is not None and self.own_broker:
                self.broker.stop()
