"""The chaos monkey: ``kill -9`` a random subset of the processes, restart each after a pause.

Every subset size from one process to all of them is drawn at least once (the schedule starts
from ``1..n`` and pads it with random sizes, then shuffles), so a run always includes killing
the broker together with every producer and consumer.  Before each strike the monkey waits until
the previous victims are running again (not necessarily ready: killing a process while it starts
up is a fault worth having), so "a subset of size k" always means k of all n processes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.chaos.procs import Child

log = logging.getLogger("txmsg.chaos")


@dataclass
class Strike:
    at: float
    victims: list[str]


@dataclass
class MonkeyReport:
    strikes: list[Strike] = field(default_factory=list)
    kills: Counter[str] = field(default_factory=Counter)
    """kills per process kind (broker / producer / consumer)."""
    restart_failures: list[str] = field(default_factory=list)

    @property
    def sizes(self) -> set[int]:
        return {len(s.victims) for s in self.strikes}


def schedule(n: int, strikes: int, rng: random.Random) -> list[int]:
    """Subset sizes for ``strikes`` strikes (at least ``n``): every size in ``1..n`` once, the
    rest random."""
    sizes = list(range(1, n + 1)) + [rng.randint(1, n) for _ in range(max(0, strikes - n))]
    rng.shuffle(sizes)
    return sizes


class Monkey:
    def __init__(
        self,
        children: Sequence[Child],
        *,
        strikes: int,
        interval: tuple[float, float],
        pause: tuple[float, float],
        seed: int,
    ) -> None:
        self.children = list(children)
        self.rng = random.Random(seed)
        self.sizes = schedule(len(self.children), strikes, self.rng)
        self.interval = interval
        self.pause = pause
        self.report = MonkeyReport()
        self.stopped = threading.Event()
        self._restarts: list[threading.Thread] = []

    def run(self) -> MonkeyReport:
        started = time.monotonic()
        for number, size in enumerate(self.sizes, 1):
            if self.stopped.wait(self.rng.uniform(*self.interval)):
                break
            self.wait_all_running(120.0)
            victims = self.rng.sample(self.children, size)
            for child in victims:
                child.kill()
                self.report.kills[child.kind] += 1
            names = [c.name for c in victims]
            self.report.strikes.append(Strike(time.monotonic() - started, names))
            log.info("strike %d/%d: kill -9 %s", number, len(self.sizes), " ".join(names))
            for child in victims:
                thread = threading.Thread(
                    target=self._restart, args=(child, self.rng.uniform(*self.pause)), daemon=True
                )
                thread.start()
                self._restarts.append(thread)
        self.wait_all_running(120.0)
        return self.report

    def _restart(self, child: Child, pause: float) -> None:
        time.sleep(pause)
        try:
            child.start()
        except Exception as exc:  # noqa: BLE001 - reported; the run's check then fails loudly
            self.report.restart_failures.append(f"{child.name}: {exc}")
            log.error("could not restart %s: %s", child.name, exc)

    def wait_all_running(self, timeout: float) -> None:
        for thread in self._restarts:
            thread.join(timeout)
        self._restarts = [t for t in self._restarts if t.is_alive()]
