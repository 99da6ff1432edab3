"""How long ``import txmsg`` takes in a fresh interpreter (goal: under 150 ms).

    python -m benchmarks.import_time [--runs 10] [--statement "import txmsg"] [--top 12]

Why: every process that sends a message, every CLI call and every health-job worker pays it, and
the heavy dependencies (pydantic, SQLAlchemy, injector, the native client) are easy to pull in at
import time by accident.  Each run is a fresh interpreter (``python -c``) that times the import
statement itself, wall clock and CPU, so interpreter start-up and site-packages processing are not
counted (timing whole processes and subtracting ``python -c pass`` drowned in the noise of a shared
machine).  The median wall time of the runs is the result; CPU time is printed next to it.

Then one ``python -X importtime`` run of the statement and of the README's first use
(``from txmsg import TxMsg, TxMsgConfig``, which loads the lazily imported API) lists the heaviest
packages and which txmsg module pulls each in: what would have to become lazy if the figure goes
over the goal.  Final line:
``RESULT import_time median_ms=<x> cpu_ms=<c> min_ms=<y> first_use_ms=<z> goal_ms=150
ratio=<goal/median>``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

GOAL_MS = 150.0
FIRST_USE = "from txmsg import TxMsg, TxMsgConfig"


_TIMED = """\
import time
wall, cpu = time.perf_counter(), time.process_time()
{statement}
print(time.perf_counter() - wall, time.process_time() - cpu)
"""


def _timed(statement: str, cwd: str) -> tuple[float, float]:
    """Wall and CPU milliseconds of ``statement`` in a fresh interpreter (start-up not counted)."""
    proc = subprocess.run(
        [sys.executable, "-c", _TIMED.format(statement=statement)],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    wall, cpu = proc.stdout.split()[-2:]
    return float(wall) * 1000.0, float(cpu) * 1000.0


def measure(statement: str, runs: int, cwd: str) -> tuple[list[float], list[float]]:
    """Per run, wall and CPU milliseconds of ``statement``, each in a fresh interpreter."""
    _timed(statement, cwd)  # write the bytecode caches once; the runs measure the warm case
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = _timed(statement, cwd)
        walls.append(wall)
        cpus.append(cpu)
    return walls, cpus


@dataclass(frozen=True)
class Entry:
    depth: int
    name: str
    self_us: int
    cumulative_us: int


def importtime(statement: str, cwd: str) -> list[Entry]:
    """The ``-X importtime`` table of ``statement`` (children are listed before their parent)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    entries = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        depth = (len(name) - len(name.lstrip(" "))) // 2
        entries.append(Entry(depth, name.strip(), int(self_us), int(cumulative_us)))
    return entries


def _importer(entries: list[Entry], index: int) -> str:
    """The txmsg module whose import pulled entry ``index`` in (its nearest txmsg ancestor).

    ``-X importtime`` nests only imports made while another module is being imported; a top-level
    entry listed after ``txmsg`` itself was loaded at run time by txmsg's lazy ``__getattr__``
    (the lazily loaded module then shows as a sibling, not as the parent)."""
    depth = entries[index].depth
    for later in entries[index + 1 :]:
        if later.depth < depth:
            depth = later.depth
            if later.name.split(".")[0] == "txmsg":
                return later.name
    if depth == 0 and any(e.name == "txmsg" for e in entries[:index]):
        return "a lazily loaded txmsg module"
    return "-"


def heaviest(entries: list[Entry], top: int) -> list[tuple[Entry, str]]:
    """Packages a txmsg module imports (first time), by cumulative time, with that module.

    Only the first (outermost) import of a package is counted, so a package pulled in by another
    one is part of that one's figure, not listed twice."""
    seen: dict[str, tuple[Entry, str]] = {}
    for i, entry in enumerate(entries):
        root = entry.name.split(".")[0]
        if root in {"txmsg", "site", "encodings"} or root.startswith(("_", "__editable__")):
            continue
        if entry.name != root and root in seen:
            continue
        best = seen.get(root)
        if best is None or entry.cumulative_us > best[0].cumulative_us:
            seen[root] = (entry, _importer(entries, i))
    ranked = sorted(seen.values(), key=lambda item: item[0].cumulative_us, reverse=True)
    return [(e, who) for e, who in ranked if who != "-"][:top]


def report(statement: str, cwd: str, top: int) -> float:
    """Print the heaviest imports of ``statement``; return its -X importtime total (ms)."""
    entries = importtime(statement, cwd)
    total = sum(
        e.cumulative_us for e in entries if e.depth == 0 and e.name.split(".")[0] == "txmsg"
    )
    print(f"-X importtime {statement!r}: txmsg modules {total / 1000:.1f} ms (cumulative)")
    for entry, who in heaviest(entries, top):
        print(f"    {entry.cumulative_us / 1000:7.1f} ms  {entry.name:<24} imported by {who}")
    own = sorted((e for e in entries if e.name.split(".")[0] == "txmsg"), key=lambda e: -e.self_us)
    print(
        "    txmsg's own module bodies (self): "
        + ", ".join(f"{e.name} {e.self_us / 1000:.1f} ms" for e in own[:5])
    )
    return total / 1000.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh-interpreter pairs to time")
    parser.add_argument("--statement", default="import txmsg")
    parser.add_argument("--top", type=int, default=12, help="heaviest packages to list")
    args = parser.parse_args(argv)

    # outside the checkout, so the installed package is imported as users get it
    with tempfile.TemporaryDirectory(prefix="txmsg-import-time-") as cwd:
        env_note = f"python {sys.version.split()[0]} ({sys.executable}), cwd {cwd}"
        print(f"{args.runs} runs of {args.statement!r}, each in a fresh interpreter; {env_note}")
        walls, cpus = measure(args.statement, args.runs, cwd)
        print("wall per run (ms): " + ", ".join(f"{w:.1f}" for w in walls))
        print("cpu  per run (ms): " + ", ".join(f"{c:.1f}" for c in cpus))
        first_walls, _ = measure(FIRST_USE, max(3, args.runs // 2), cwd)
        median, cpu, first_use = (statistics.median(x) for x in (walls, cpus, first_walls))
        print(
            f"{args.statement!r}: median {median:.1f} ms wall, {cpu:.1f} ms CPU, min "
            f"{min(walls):.1f} ms (goal < {GOAL_MS:.0f} ms); {FIRST_USE!r}: median "
            f"{first_use:.1f} ms wall"
        )
        report(args.statement, cwd, args.top)
        report(FIRST_USE, cwd, args.top)
    ratio = GOAL_MS / max(median, 1e-3)
    print(
        f"RESULT import_time median_ms={median:.1f} cpu_ms={cpu:.1f} min_ms={min(walls):.1f} "
        f"first_use_ms={first_use:.1f} goal_ms={GOAL_MS:.0f} ratio={ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
