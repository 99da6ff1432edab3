"""Where a test run's time went: ``python scripts/suite_profile.py TIMELINE [PACCT]``.

TIMELINE: the file a run wrote with ``TXMSG_TEST_TIMELINE=PATH`` (conftest.py): per xdist worker,
when it started its first test and ended its last, its busy seconds, and the lanes (xdist groups)
it ran with their seconds, then the longest tests. PACCT (optional): a BSD process-accounting
file of the same run (Debian's ``acct``: ``accton FILE`` before, ``accton off`` after), read with
``dump-acct``: CPU seconds per command name over every process that exited during the run, since
the suite on 2 cores is bound by CPU, not by any one test (docs/guide/testing.md).
"""

from __future__ import annotations

import collections
import subprocess
import sys


def timeline(path: str, longest: int = 15) -> None:
    started: dict[tuple[str, str], float] = {}
    rows: list[tuple[str, float, float, str]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 5)
            if len(parts) < 6:
                continue
            kind, worker, at, _pid, _cpu, nodeid = parts
            if worker == "-":  # not a worker (an older timeline's controller lines)
                continue
            if kind == "S":
                started[(worker, nodeid)] = float(at)
            else:
                rows.append((worker, started.pop((worker, nodeid), float(at)), float(at), nodeid))
    if not rows:
        sys.exit(f"{path}: no finished test")
    t0 = min(r[1] for r in rows)
    by_worker: dict[str, list[tuple[str, float, float, str]]] = collections.defaultdict(list)
    for r in rows:
        by_worker[r[0]].append(r)
    for worker in sorted(by_worker):
        mine = sorted(by_worker[worker], key=lambda r: r[1])
        lanes: dict[str, float] = collections.defaultdict(float)
        for _w, a, b, nodeid in mine:
            lanes[nodeid.rpartition("@")[2] if "@" in nodeid else "(ungrouped)"] += b - a
        busy = sum(b - a for _w, a, b, _n in mine)
        print(
            f"{worker}: {mine[0][1] - t0:.0f}-{mine[-1][2] - t0:.0f} s, busy {busy:.0f} s, "
            f"{len(mine)} tests; "
            + ", ".join(
                f"{k} {v:.0f} s" for k, v in sorted(lanes.items(), key=lambda kv: -kv[1])[:4]
            )
        )
    print(f"longest {longest}:")
    for _w, a, b, nodeid in sorted(rows, key=lambda r: r[1] - r[2])[:longest]:
        print(f"  {b - a:7.1f} s  {nodeid}")


def cpu(pacct: str) -> None:
    out = subprocess.run(  # noqa: S603 - a fixed command on the file named by the caller
        ["dump-acct", pacct],  # noqa: S607 - Debian's acct on PATH
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seconds: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for line in out.splitlines():
        fields = [x.strip() for x in line.split("|")]
        if len(fields) < 5:
            continue
        used = (float(fields[2]) + float(fields[3])) / 100  # clock ticks (AHZ 100)
        seconds[fields[0]] += used
        count[fields[0]] += 1
    print(f"CPU of every process that exited: {sum(seconds.values()):.0f} s")
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {s:7.1f} s  {count[name]:5d} processes  {name}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    timeline(sys.argv[1])
    if len(sys.argv) == 3:
        cpu(sys.argv[2])
