"""Network faults of the chaos run (``txmsg chaos --faults network``) and their figures.

Every broker connection of every client runs through :class:`~benchmarks.chaos.proxy.FaultProxy`
(the broker publishes the proxy's address as ``brokerIP1``).  The :class:`NetworkMonkey` strikes
with one fault at a time, each kind at least once, then a quiet gap:

* ``latency`` - every chunk both ways held 100-400 ms, for 4-8 s;
* ``reset`` - RST half of the live connections (chosen at random), twice in 4-6 s;
* ``half-open`` - one producer process's connections stop forwarding one way (``up``: its sends and
  its one-way END_TRANSACTION / check answers are lost; ``down``: the broker gets everything, the
  producer hears nothing back) for 3-6 s, then they are reset (a half-open stream is broken);
* ``partition`` - one producer process is cut off both ways (paused, TCP buffers, no error) for
  longer than the broker's check interval (4-8 x it), then healed.

The checker's invariants do not change.  Figures per fault kind (:func:`figures`): payments started
while it was on (and until the next strike), their latency (``finished_at - started_at`` from the
producer's journal) and outcomes, and the duplicate deliveries the idempotent consumers absorbed
from the strike's start to the next strike's start.  The ``none`` row is the warm-up before the
first strike.
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from benchmarks.chaos.check import SERVICE_GROUPS
from benchmarks.chaos.databases import PaymentAttempt
from benchmarks.chaos.proxy import PROXY_IP, FaultProxy
from txmsg.sqla import duplicates_absorbed

log = logging.getLogger("txmsg.chaos")

FAULTS = ("latency", "reset", "half-open", "partition")
FAULT_CHOICES = ("kill", "network")
"""``--faults`` values: kill -9 strikes (the monkey), network strikes (this module), or both."""


@dataclass
class Window:
    kind: str
    detail: str
    start: float
    end: float
    duplicates_at_start: int = 0
    duplicates_at_next: int = 0


@dataclass
class NetworkReport:
    windows: list[Window] = field(default_factory=list)
    warmup_start: float = 0.0
    warmup_duplicates: tuple[int, int] = (0, 0)
    accepted: int = 0
    resets: int = 0
    discarded_bytes: int = 0


def schedule(strikes: int, rng: random.Random) -> list[str]:
    """Every fault kind at least once, the rest random, shuffled."""
    kinds = list(FAULTS) + [rng.choice(FAULTS) for _ in range(max(0, strikes - len(FAULTS)))]
    rng.shuffle(kinds)
    return kinds


class NetworkMonkey:
    def __init__(
        self,
        proxy: FaultProxy,
        producers: Sequence[object],
        *,
        strikes: int,
        gap: tuple[float, float],
        check_interval: float,
        seed: int,
        duplicates: Callable[[], int],
    ) -> None:
        self.proxy = proxy
        self.producers = list(producers)
        self.rng = random.Random(f"network:{seed}")
        self.kinds = schedule(strikes, self.rng)
        self.gap = gap
        self.check_interval = check_interval
        self.duplicates = duplicates
        self.report = NetworkReport()
        self.stopped = threading.Event()

    def run(self, warmup_start: float) -> NetworkReport:
        report = self.report
        report.warmup_start = warmup_start
        previous: Window | None = None
        first = self.duplicates()
        report.warmup_duplicates = (0, first)
        for number, kind in enumerate(self.kinds, 1):
            if self.stopped.wait(self.rng.uniform(*self.gap)):
                break
            dup = self.duplicates()
            if previous is not None:
                previous.duplicates_at_next = dup
            else:
                report.warmup_duplicates = (0, dup)
            window = Window(kind, "", time.time(), 0.0, duplicates_at_start=dup)
            window.detail = self._strike(kind)
            window.end = time.time()
            log.info("network strike %d/%d: %s %s", number, len(self.kinds), kind, window.detail)
            report.windows.append(window)
            previous = window
        if previous is not None:
            self.stopped.wait(self.gap[1])  # the last strike's after-effects
            previous.duplicates_at_next = self.duplicates()
        self.proxy.set_latency(0.0)
        stats = self.proxy.stats
        report.accepted, report.resets, report.discarded_bytes = (
            stats.accepted,
            stats.resets,
            stats.discarded_bytes,
        )
        return report

    def _producer(self) -> tuple[str, int | None]:
        child = self.rng.choice(self.producers)
        proc = getattr(child, "proc", None)
        return str(getattr(child, "name", "?")), (proc.pid if proc is not None else None)

    def _strike(self, kind: str) -> str:
        rng, proxy = self.rng, self.proxy
        if kind == "latency":
            delay, duration = rng.uniform(0.1, 0.4), rng.uniform(4.0, 8.0)
            proxy.set_latency(delay)
            self.stopped.wait(duration)
            proxy.set_latency(0.0)
            return f"+{delay * 1000:.0f} ms both ways for {duration:.1f} s"
        if kind == "reset":
            duration = rng.uniform(4.0, 6.0)
            first = proxy.reset(lambda _link: rng.random() < 0.5)
            self.stopped.wait(duration / 2)
            second = proxy.reset(lambda _link: rng.random() < 0.5)
            self.stopped.wait(duration / 2)
            return f"RST {first} + {second} connections in {duration:.1f} s"
        name, pid = self._producer()
        if pid is None:
            return f"{name} not running: skipped"
        if kind == "half-open":
            direction = rng.choice(("up", "down"))
            duration = rng.uniform(3.0, 6.0)
            proxy.set_mode(pid, direction, "discard")  # type: ignore[arg-type]
            self.stopped.wait(duration)
            links = proxy.reset(lambda link: link.pid == pid)
            proxy.set_mode(pid, direction, "pass")  # type: ignore[arg-type]
            return f"{name} {direction} lost for {duration:.1f} s, then {links} connections reset"
        duration = rng.uniform(4.0, 8.0) * self.check_interval
        proxy.set_mode(pid, "up", "pause")
        proxy.set_mode(pid, "down", "pause")
        self.stopped.wait(duration)
        held = len(proxy.links_of(pid))
        proxy.set_mode(pid, "up", "pass")
        proxy.set_mode(pid, "down", "pass")
        return f"{name} cut off for {duration:.1f} s ({held} connections held), then healed"


def duplicates_total(dbs: dict[str, sessionmaker[Session]]) -> int:
    """Duplicate deliveries absorbed so far by the three idempotent services (cheap: one count each)."""
    return sum(duplicates_absorbed(dbs[s], group) for s, group in SERVICE_GROUPS.items())


# -- figures -----------------------------------------------------------------------------------
@dataclass
class FaultFigures:
    kind: str
    strikes: int = 0
    seconds: float = 0.0
    payments: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    unknown: int = 0
    duplicates: int = 0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def median(self) -> float:
        return statistics.median(self.latencies) if self.latencies else 0.0


def _epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite keeps naive UTC
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def figures(report: NetworkReport, orders: sessionmaker[Session]) -> list[FaultFigures]:
    """Per fault kind (and ``none`` for the warm-up): payments started in its windows (a window
    runs from its strike to the next strike), their latency and outcomes, duplicates absorbed."""
    with orders() as session:
        rows = [
            (_epoch(a.started_at), _epoch(a.finished_at), a.outcome)
            for a in session.scalars(select(PaymentAttempt))
        ]
    bounds: list[tuple[str, float, float, int]] = []
    windows = report.windows
    if windows:
        low, high = report.warmup_duplicates
        bounds.append(("none", report.warmup_start, windows[0].start, high - low))
    for i, window in enumerate(windows):
        end = windows[i + 1].start if i + 1 < len(windows) else window.end + 5.0
        bounds.append(
            (window.kind, window.start, end, window.duplicates_at_next - window.duplicates_at_start)
        )
    out: dict[str, FaultFigures] = {}
    for kind in ("none", *FAULTS):
        out[kind] = FaultFigures(kind)
    for kind, start, end, dups in bounds:
        fig = out[kind]
        fig.strikes += kind != "none"
        fig.seconds += end - start
        fig.duplicates += max(0, dups)
        for started, finished, outcome in rows:
            if started is None or not start <= started < end:
                continue
            fig.payments += 1
            if finished is not None:
                fig.latencies.append(finished - started)
            if outcome == "ERROR":
                fig.errors += 1
            elif outcome in (None, "UNKNOW"):
                fig.unknown += 1
    return [f for f in out.values() if f.strikes or f.kind == "none"]


class NetworkFaults:
    """The chaos run's side of ``--faults network``: broker settings, the proxy, the monkey."""

    def __init__(self, *, strikes: int, gap: tuple[float, float], seed: int) -> None:
        self.strikes = strikes
        self.gap = gap
        self.seed = seed
        self.proxy: FaultProxy | None = None
        self.monkey: NetworkMonkey | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def broker_settings() -> dict[str, str]:
        """The broker publishes the proxy's IP (same port) in its routes."""
        return {"broker_ip1": PROXY_IP}

    def start_proxy(self, broker_ports: list[int], owners: Callable[[], list[int]]) -> FaultProxy:
        """One listener per broker: ``PROXY_IP:port`` relays to ``127.0.0.1:port``."""
        routes = {(PROXY_IP, port): ("127.0.0.1", port) for port in broker_ports}
        self.proxy = FaultProxy(routes, owners).start()
        return self.proxy

    def start_monkey(
        self,
        producers: Sequence[object],
        check_interval: float,
        duplicates: Callable[[], int],
        warmup_start: float,
    ) -> None:
        if self.proxy is None:
            raise RuntimeError("start_proxy() before start_monkey()")
        self.monkey = NetworkMonkey(
            self.proxy,
            producers,
            strikes=self.strikes,
            gap=self.gap,
            check_interval=check_interval,
            seed=self.seed,
            duplicates=duplicates,
        )
        monkey = self.monkey
        self._thread = threading.Thread(
            target=monkey.run, args=(warmup_start,), name="chaos-network-monkey", daemon=True
        )
        self._thread.start()

    def wait(self, timeout: float | None = None) -> NetworkReport | None:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.monkey.report if self.monkey is not None else None

    def stop(self) -> None:
        if self.monkey is not None:
            self.monkey.stopped.set()
        self.wait(30)
        if self.proxy is not None:
            self.proxy.stop()
