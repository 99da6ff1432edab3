"""One chaos run: databases, broker, producers, consumers, the monkey, settling, the check."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from txmsg_broker.app import BrokerProcess
from txmsg_broker.cluster import BrokerCluster
from txmsg_broker.testing import create_group, wait_until
from txmsg_samples.order.demo_run import create_transaction_topic
from txmsg_samples.order.events import TOPIC

from benchmarks.chaos import check, faults, outbox_stream, tracking
from benchmarks.chaos.databases import close_all, open_all, prepare
from benchmarks.chaos.discards import DiscardFigures
from benchmarks.chaos.discards import baseline as discard_baseline
from benchmarks.chaos.discards import read as read_discards
from benchmarks.chaos.faults import FaultFigures, NetworkFaults, NetworkReport
from benchmarks.chaos.monkey import Monkey, MonkeyReport
from benchmarks.chaos.procs import BrokerChild, Child, ServiceProcess
from benchmarks.chaos.roles import STOP_PAYING
from benchmarks.chaos.settings import ChaosSettings

log = logging.getLogger("txmsg.chaos")

BROKER_SETTINGS: dict[str, Any] = {
    "flush": "sync",
    "transaction_timeout_ms": 2000,
    "check_interval_ms": 1000,
    # a real check horizon (issue 39): about timeout + max * interval = 5 s, shorter than a strike
    # that keeps every producer of the group down (restart pause + start-up), so such strikes make
    # the broker discard half messages, as a production broker does after 15 x 60 s; the rescuer
    # (txmsg.rescue) must then re-send the committed ones (benchmarks.chaos.discards)
    "check_max": 3,
    "delay_scale": 0.01,  # consumer retries after 0.1 s, not 10 s
}


@dataclass
class RunOptions:
    strikes: int = 20
    interval: tuple[float, float] = (2.0, 6.0)
    pause: tuple[float, float] = (0.5, 3.0)
    warmup: float = 10.0
    settle_timeout: float = 240.0
    database_url: str | None = None
    brokers: int = 1
    """Broker processes (broker-a, broker-b, ... behind one name server process when > 1)."""
    faults: tuple[str, ...] = ("kill",)
    """``kill`` (the kill -9 monkey), ``network`` (fault-proxy strikes: benchmarks.chaos.faults)."""
    network_strikes: int = 8
    network_gap: tuple[float, float] = (2.0, 4.0)
    backend: str = "rocketmq"
    """``rocketmq5``: the broker also serves gRPC (a fixed port across restarts) and the services
    use the 5.x client against it; one broker, kill faults only (see :func:`backend_problem`)."""
    name_server: str | None = None
    """An external cluster's name server (``--name-server``): no broker is started, so none is
    killed; the strikes hit producers and consumers only.  Topics and groups are created on it."""
    endpoints: str | None = None
    """With ``name_server`` and ``rocketmq5``: that cluster's 5.x proxy (``--endpoints``)."""
    check_max: int = BROKER_SETTINGS["check_max"]
    """The embedded brokers' ``transactionCheckMax`` (``--check-max``): with the check timing of
    :data:`BROKER_SETTINGS` it sets the check horizon.  An external cluster keeps its own."""


BACKENDS = ("rocketmq", "rocketmq5")


def external_problem(
    backend: str, name_server: str | None, endpoints: str | None, fault_kinds: tuple[str, ...]
) -> str | None:
    """Why a run against an external cluster cannot go this way (None: it can, or no cluster)."""
    if name_server is None:
        return (
            "--endpoints needs --name-server too (topics are created there)" if endpoints else None
        )
    if "network" in fault_kinds:
        return (
            "--faults network relays the brokers' ports through the fault proxy, which needs "
            "brokers this run starts: use --faults kill against an external cluster"
        )
    if backend == "rocketmq5" and not endpoints:
        return "--backend rocketmq5 against an external cluster needs --endpoints (its 5.x proxy)"
    return None


def backend_problem(backend: str, brokers: int, fault_kinds: tuple[str, ...]) -> str | None:
    """Why this combination cannot run (None: it can).

    The embedded broker's gRPC endpoint is a local-mode proxy of one broker (broker-a of a
    cluster), so rocketmq5 clients would never see broker-b; and the fault proxy relays the
    remoting ports that brokers publish as ``brokerIP1``, which gRPC clients do not use.
    """
    if backend not in BACKENDS:
        return f"backend {backend!r}: use one of {', '.join(BACKENDS)}"
    if backend != "rocketmq5":
        return None
    if brokers != 1:
        return (
            "--backend rocketmq5 runs against one broker: its gRPC endpoint serves that broker "
            "only (broker-a of a cluster); use --brokers 1"
        )
    if "network" in fault_kinds:
        return (
            "--backend rocketmq5 takes --faults kill only: the fault proxy relays the remoting "
            "broker ports, not the gRPC endpoint the 5.x client talks to"
        )
    return None


@dataclass
class ChaosResult:
    settings: ChaosSettings
    monkey: MonkeyReport
    at_monkey_stop: check.Snapshot
    final: check.Snapshot
    settled: bool
    settle_seconds: float
    run_seconds: float
    process_counts: dict[str, int] = field(default_factory=dict)
    network: list[FaultFigures] = field(default_factory=list)
    """Per network-fault figures (``--faults network``)."""
    outbox: outbox_stream.OutboxSnapshot | None = None
    """The outbox stream after settling (None when the run did not drive it)."""
    outbox_violations: list[str] = field(default_factory=list)
    outbox_at_stop: outbox_stream.OutboxSnapshot | None = None
    relay_takeovers: int = 0
    discards: DiscardFigures = field(default_factory=DiscardFigures)
    """Half messages the brokers discarded after their last check-back, and what the rescuer did
    with them (:mod:`benchmarks.chaos.discards`)."""

    @property
    def violations(self) -> list[str]:
        out = list(self.final.violations) + list(self.outbox_violations)
        if not self.settled:
            out.insert(0, f"did not settle within the settle timeout ({self.settle_seconds:.0f} s)")
        out.extend(f"restart failed: {r}" for r in self.monkey.restart_failures)
        return out


class ChaosRun:
    def __init__(self, settings: ChaosSettings, options: RunOptions) -> None:
        problem = backend_problem(
            options.backend, options.brokers, options.faults
        ) or external_problem(
            options.backend, options.name_server, options.endpoints, options.faults
        )
        if problem:
            raise ValueError(problem)
        self.settings = settings
        self.options = options
        self.brokers: list[BrokerChild] = []
        self.cluster: BrokerCluster | None = None
        self.producers: list[ServiceProcess] = []
        self.consumers: list[ServiceProcess] = []
        self.outbox_procs: list[ServiceProcess] = []
        """The outbox stream's writers, relay processes and ledger consumers."""
        self.discards_before: dict[str, int] = {}
        """Each broker's discard topic max offset at the start (:func:`discard_baseline`)."""
        self.network = (
            NetworkFaults(
                strikes=options.network_strikes, gap=options.network_gap, seed=settings.seed
            )
            if "network" in options.faults
            else None
        )

    def run(self) -> ChaosResult:
        started = time.monotonic()
        workdir = self.settings.workdir
        (workdir / STOP_PAYING).unlink(missing_ok=True)
        urls = prepare(workdir, self.options.database_url)
        name_server = self._start_brokers(workdir)
        self._start_proxy()
        self.settings = self.settings.model_copy(
            update={
                "name_server": name_server,
                "database_urls": urls,
                "backend": self.options.backend,
                "endpoints": self.options.endpoints
                or (self.brokers[0].process.grpc_endpoint if self.brokers else None)
                or "",
            }
        )
        settings_file = str(self.settings.save())
        # an external cluster's discard topic holds earlier runs' discards: count from here
        self.discards_before = discard_baseline(self.settings.name_server)
        # 8 queues: enough for every consumer instance of a service to own some
        create_transaction_topic(self.settings.name_server, TOPIC, queues=8)
        create_fifo_topic(self.settings.name_server, tracking.TOPIC, queues=8)
        # `mqadmin updateSubGroup -o true`: a RocketMQ 5 proxy pops a group in order only then
        create_group(self.settings.name_server, tracking.GROUP, orderly=True)
        logs = workdir / "logs"
        streams = self.settings.streams
        if "outbox" in streams:
            create_fifo_topic(self.settings.name_server, outbox_stream.TOPIC, queues=8)
            create_group(self.settings.name_server, outbox_stream.GROUP, orderly=True)
            self.outbox_procs = self._outbox_processes(settings_file, logs)
        self.producers = [
            ServiceProcess(
                "producer",
                f"producer-{i}",
                ["producer", settings_file, str(i)],
                logs / f"producer-{i}.log",
            )
            for i in range(self.settings.producers)
            if "orders" in streams
        ]
        self.consumers = [
            ServiceProcess(
                "consumer",
                f"{service}-{i}",
                ["consumer", settings_file, service, str(i)],
                logs / f"{service}-{i}.log",
            )
            for service in ("points", "logistics", "cart", "tracking")
            for i in range(self.settings.consumers_per_service)
            if "orders" in streams
        ]
        everything: list[Child] = [
            *self.brokers,
            *self.producers,
            *self.consumers,
            *self.outbox_procs,
        ]
        dbs = open_all(urls)
        if "outbox" in streams:
            outbox_stream.seed(dbs["bank"], dbs["ledger"])
        network: NetworkReport | None = None
        outbox_at_stop = outbox_final = None
        try:
            for child in [*self.consumers, *self.producers, *self.outbox_procs]:
                child.start()
            self._wait_ready(120.0)
            warmup_start = time.time()
            time.sleep(self.options.warmup)
            self._start_network_monkey(dbs, warmup_start)
            monkey = Monkey(
                everything,
                strikes=self.options.strikes,
                interval=self.options.interval,
                pause=self.options.pause,
                seed=self.settings.seed,
            )
            report = monkey.run() if "kill" in self.options.faults else MonkeyReport()
            network = self.network.wait() if self.network is not None else None
            self._wait_ready(180.0)
            # stop paying, keep answering check-backs and consuming
            (workdir / STOP_PAYING).touch()
            for producer in [*self.producers, *self.writers]:
                producer.signal(signal.SIGUSR1)
            at_stop = check.snapshot(dbs)
            if self.outbox_procs:
                outbox_at_stop = outbox_stream.read(dbs["bank"], dbs["ledger"])
            settled, settle_seconds = self._settle(dbs)
            discarded = self._wait_for_rescues(logs, settle_seconds)
            final = check.verify(dbs, self.settings)
            if self.outbox_procs:
                outbox_final = outbox_stream.read(dbs["bank"], dbs["ledger"])
        finally:
            for child in [*self.producers, *self.consumers, *self.outbox_procs]:
                child.stop(15.0)
            for broker in self.brokers:
                broker.stop(15.0)
            if self.cluster is not None:
                self.cluster.stop(15.0)
            if self.network is not None:
                self.network.stop()
            figures = faults.figures(network, dbs["orders"]) if network is not None else []
            close_all(dbs)
        return ChaosResult(
            self.settings,
            report,
            at_stop,
            final,
            settled,
            settle_seconds,
            time.monotonic() - started,
            {
                "broker": len(self.brokers),
                "producer": len(self.producers),
                "consumer": len(self.consumers),
                "outbox-writer": len(self.writers),
                "outbox-relay": sum(c.kind == "outbox-relay" for c in self.outbox_procs),
                "ledger": sum(c.kind == "consumer" for c in self.outbox_procs),
            },
            figures,
            outbox=outbox_final,
            outbox_violations=outbox_stream.verify(outbox_final) if outbox_final else [],
            outbox_at_stop=outbox_at_stop,
            relay_takeovers=outbox_stream.relay_takeovers(logs) if self.outbox_procs else 0,
            discards=discarded,
        )

    # -- the outbox stream (benchmarks.chaos.outbox_stream) ----------------------------------
    def _outbox_processes(self, settings_file: str, logs: Path) -> list[ServiceProcess]:
        """Writers (writer 0 relays in process), relay processes, ledger consumers."""
        settings = self.settings
        writers = [
            ServiceProcess(
                "outbox-writer",
                f"writer-{i}",
                ["outbox-writer", settings_file, str(i)],
                logs / f"writer-{i}.log",
            )
            for i in range(settings.outbox_writers)
        ]
        relays = [
            ServiceProcess(
                "outbox-relay",
                f"relay-{i}",
                [],
                logs / f"relay-{i}.log",
                argv=[
                    sys.executable,
                    "-c",
                    "import sys; from txmsg.cli import main; sys.exit(main())",
                    "outbox",
                    "relay",
                    "--app",
                    "benchmarks.chaos.outbox_stream:relay_app",
                ],
                ready_mark=b"relaying ",
                env={outbox_stream.SETTINGS_ENV: settings_file},
            )
            for i in range(settings.outbox_relays)
        ]
        ledgers = [
            ServiceProcess(
                "consumer",
                f"ledger-{i}",
                ["consumer", settings_file, "ledger", str(i)],
                logs / f"ledger-{i}.log",
            )
            for i in range(settings.consumers_per_service)
        ]
        return [*writers, *relays, *ledgers]

    @property
    def writers(self) -> list[ServiceProcess]:
        return [c for c in self.outbox_procs if c.kind == "outbox-writer"]

    # -- network faults (benchmarks.chaos.faults) --------------------------------------------
    @property
    def broker_settings(self) -> dict[str, Any]:
        extra = NetworkFaults.broker_settings() if self.network is not None else {}
        # rocketmq5: a gRPC endpoint on a free port, which BrokerProcess keeps for restarts
        grpc = {"grpc_port": 0} if self.options.backend == "rocketmq5" else {}
        return {**BROKER_SETTINGS, **extra, **grpc, "check_max": self.options.check_max}

    def _start_proxy(self) -> None:
        if self.network is None:
            return
        clients = lambda: [  # noqa: E731 - the proxy asks for the current pids
            c.proc.pid
            for c in [*self.producers, *self.consumers, *self.outbox_procs]
            if c.proc is not None
        ]
        self.network.start_proxy([b.process.broker_port for b in self.brokers], clients)

    def _start_network_monkey(
        self, dbs: dict[str, sessionmaker[Session]], warmup_start: float
    ) -> None:
        if self.network is None:
            return
        # half-open and partition strike a sending process: an order producer, or (outbox stream)
        # a writer or relay process, whose relay's sends and answers are cut
        senders = [*self.producers, *(c for c in self.outbox_procs if c.kind != "consumer")]
        self.network.start_monkey(
            senders,
            BROKER_SETTINGS["check_interval_ms"] / 1000,
            lambda: faults.duplicates_total(dbs),
            warmup_start,
        )

    def _start_brokers(self, workdir: Path) -> str:
        """Start the broker process(es); the name server address (an external cluster's as is:
        nothing is started, so the monkey never kills a broker it does not own)."""
        if self.options.name_server is not None:
            return self.options.name_server
        base = workdir / "broker"
        if self.options.brokers == 1:
            self.brokers = [
                BrokerChild(BrokerProcess(base / "data", base / "logs", **self.broker_settings))
            ]
            self.brokers[0].start()
            return self.brokers[0].process.namesrv_addr
        self.cluster = BrokerCluster(
            base / "data", base / "logs", brokers=self.options.brokers, **self.broker_settings
        )
        self.cluster.start(timeout=60)
        self.brokers = [
            BrokerChild(proc, str(proc.settings["broker_name"])) for proc in self.cluster.brokers
        ]
        return self.cluster.namesrv_addr

    def _wait_ready(self, timeout: float) -> None:
        children = [*self.producers, *self.consumers, *self.outbox_procs]

        def all_ready() -> bool:
            self._revive()
            return all(c.ready for c in children)

        try:
            wait_until(
                all_ready, timeout=timeout, interval=0.5, message="the chaos processes to start"
            )
        except AssertionError:
            tails = "; ".join(f"{c.name}: {_tail(c.log)}" for c in children if not c.ready)
            raise RuntimeError(f"processes did not start within {timeout:.0f} s: {tails}") from None

    def _revive(self) -> None:
        """Restart a service process that died on its own (not by the monkey)."""
        for child in [*self.producers, *self.consumers, *self.outbox_procs]:
            if not child.alive:
                child.start()

    def _settle(self, dbs: dict[str, sessionmaker[Session]]) -> tuple[bool, float]:
        """Poll until nothing is in flight and every service caught up (twice in a row)."""
        started = time.monotonic()
        stable = 0
        while time.monotonic() - started < self.options.settle_timeout:
            snap = check.snapshot(dbs)
            outbox = outbox_stream.read(dbs["bank"], dbs["ledger"]) if self.outbox_procs else None
            if outbox is not None:
                log.info(
                    "settling outbox: committed %d messages, applied %d, unsent %d, dead %d",
                    outbox.messages,
                    outbox.applied_count,
                    outbox.unsent,
                    outbox.dead,
                )
            bounds = snap.equations()
            log.info(
                "settling: paid %d, in flight %d, processed %s, events %d/%d%s",
                len(snap.paid),
                snap.in_flight_records,
                {s: len(p) for s, p in snap.processed.items()},
                len(snap.stream.acked & snap.stream.applied_set),
                len(snap.stream.acked),
                f" ({'; '.join(bounds)})" if bounds else "",
            )
            caught_up = snap.caught_up and (outbox is None or outbox.caught_up)
            stable = stable + 1 if caught_up else 0
            if stable >= 2:
                return True, time.monotonic() - started
            self._revive()
            time.sleep(2.0)
        return False, time.monotonic() - started

    def _wait_for_rescues(self, logs: Path, settle_seconds: float) -> DiscardFigures:
        """The discard figures, once the rescuer handled every discarded half message or the rest
        of the settle timeout ran out (the rescue consumer of a group started before the first
        discard learns the topic's route only at librocketmq's next route refresh, 30 s)."""
        deadline = time.monotonic() + max(0.0, self.options.settle_timeout - settle_seconds)
        while True:
            figures = read_discards(self.settings.name_server, logs, self.discards_before)
            if not figures.pending or time.monotonic() >= deadline:
                return figures
            log.info(
                "waiting for rescues: %d of %d discarded transactions resolved",
                figures.rescues,
                len(figures.keys),
            )
            self._revive()
            time.sleep(2.0)


def create_fifo_topic(name_server: str, topic: str, queues: int) -> None:
    """The ordered stream's topic, type FIFO: a RocketMQ 5 broker consumes a group orderly only on
    a FIFO topic (remoting clients ignore the type)."""
    done = subprocess.run(
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
            "FIFO",
            "--queues",
            str(queues),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"could not create topic {topic}: {done.stderr or done.stdout}")


def _tail(path: Path, lines: int = 3) -> str:
    if not path.exists():
        return "(no log)"
    return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
