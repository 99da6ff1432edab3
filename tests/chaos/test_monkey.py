"""The monkey's schedule covers every subset size, and it kills and restarts what it says."""

from __future__ import annotations

import random

from benchmarks.chaos.monkey import Monkey, schedule


def test_schedule_covers_every_size_at_least_once() -> None:
    for n, strikes in ((1, 1), (9, 20), (10, 100), (6, 3)):
        sizes = schedule(n, strikes, random.Random(n))
        assert set(sizes) == set(range(1, n + 1))
        assert len(sizes) == max(n, strikes)


class FakeChild:
    """Stands in for a process: the monkey only calls start/kill/alive."""

    def __init__(self, name: str) -> None:
        self.kind, self.name = "consumer", name
        self.kills = self.starts = 0
        self.alive = True

    def start(self) -> None:
        self.alive = True
        self.starts += 1

    def kill(self) -> None:
        self.alive = False
        self.kills += 1

    def stop(self, timeout: float) -> None:
        self.alive = False


def test_monkey_kills_the_scheduled_subsets_and_restarts_them() -> None:
    children = [FakeChild(f"c{i}") for i in range(4)]
    monkey = Monkey(children, strikes=6, interval=(0.0, 0.01), pause=(0.0, 0.01), seed=3)
    report = monkey.run()
    assert [len(s.victims) for s in report.strikes] == monkey.sizes
    assert report.sizes == {1, 2, 3, 4}
    assert sum(c.kills for c in children) == sum(monkey.sizes) == report.kills["consumer"]
    assert all(c.alive and c.starts == c.kills for c in children)
