"""Every output of the job from ``reduce.result``, collected once as Arrow: the driver's side.

Why on the driver: the result is small by construction (``reduce``: totals without windows, one
row per group, window and file, transactions counted per outcome), so after the one Spark job
pyarrow and plain Python derive the summary's inputs, the window table and the dashboard's series
in milliseconds, on any master. Nothing here grows with lines or transactions.
"""

from __future__ import annotations

from datetime import UTC, timezone
from typing import TYPE_CHECKING, Any

from txmsg_health import patterns as P
from txmsg_health import reduce as R
from txmsg_health.summary import WINDOW_FORMATS

if TYPE_CHECKING:
    import pyarrow as pa


def prefer_jemalloc(environ: dict[str, str] | None = None) -> None:
    """For a one-shot process: pyarrow's jemalloc pool instead of its default (mimalloc).

    Why: a fresh process's first hash aggregations cost about twice the CPU with mimalloc
    (docs/health.md, round 5); a command-line run only ever makes the first. A pool chosen by the
    user (``ARROW_DEFAULT_MEMORY_POOL``) is kept, and so is the default where pyarrow has no
    jemalloc (Windows, some macOS builds).
    """
    import os  # noqa: PLC0415 - only here

    import pyarrow as pa  # noqa: PLC0415 - the spark extra

    if (environ if environ is not None else os.environ).get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # pyarrow.lib.ArrowNotImplementedError: built without jemalloc
        return


def split(result: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
    """``reduce.result`` as (totals, windows, transactions) rows."""
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    tot, win, tx = (
        result.filter(pc.equal(result["set"], n)) for n in (R.TOTALS, R.WINDOWS, R.TRANSACTIONS)
    )
    return tot, win, tx


def files(*tables: pa.Table) -> list[str]:
    """The distinct files of the rows, sorted."""
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    found: set[str] = set()
    for t in tables:
        found.update(f for f in pc.unique(t["file"]).to_pylist() if f is not None)
    return sorted(found)


def with_broker(rows: pa.Table, names: dict[str, str]) -> pa.Table:
    """The rows with a ``broker`` column: each row's file named by ``names``."""
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    known = sorted(names)
    index = pc.index_in(rows["file"], value_set=pa.array(known, pa.string()))
    broker = pc.take(pa.array([names[f] for f in known], pa.string()), index)
    return rows.append_column("broker", broker)


def stamp_text(stamp: int | None, window: str) -> str | None:
    """A numeric stamp (``reduce.STAMP_SCALE``) as ``"<window key>|<seconds, 4 digits>"``."""
    if stamp is None:
        return None
    digits, seconds = divmod(int(stamp), R.STAMP_SCALE)
    d = f"{digits:0{12 if window == 'minute' else 10}d}"
    key = f"{d[0:4]}-{d[4:6]}-{d[6:8]} {d[8:10]}" + (f":{d[10:12]}" if window == "minute" else "")
    return f"{key}|{seconds:04d}"


def totals(rows: pa.Table, window: str) -> list[dict[str, Any]]:
    """The totals rows as dicts: ``grp``, ``file``, ``addr``, ``kind``, ``v``, ``n``, ``wmin``,
    ``wmax`` (first and last "<window key>|<seconds>")."""
    out: list[dict[str, Any]] = rows.select(
        ["grp", "file", "addr", "kind", "v", "n", "smin", "smax"]
    ).to_pylist()
    for r in out:
        r["wmin"] = stamp_text(r.pop("smin"), window)
        r["wmax"] = stamp_text(r.pop("smax"), window)
    return out


def group_names(rows: pa.Table) -> dict[int, str]:
    """Group hash -> group name, from the totals rows (every transaction's group has lines)."""
    return {
        r["lh"]: r["grp"]
        for r in rows.select(["lh", "grp"]).to_pylist()
        if r["lh"] is not None and r["grp"] is not None
    }


def half_progress(rows: pa.Table) -> tuple[dict[str, tuple[int, int, int]], dict[str, int]]:
    """Per broker: (check passes logged, least and greatest half-queue offset) and check-sent
    lines, from the totals rows with a ``broker`` column (``summary.half_messages``'s inputs)."""
    progress: dict[str, tuple[int, int, int]] = {}
    sent: dict[str, int] = {}
    for r in rows.select(["kind", "broker", "n", "omin", "omax"]).to_pylist():
        b = r["broker"]
        if r["kind"] == P.HALF_PROGRESS and r["omin"] is not None:
            n, lo, hi = progress.get(b, (0, r["omin"], r["omax"]))
            progress[b] = (n + int(r["n"]), min(lo, r["omin"]), max(hi, r["omax"]))
        elif r["kind"] == P.CHECK_SENT:
            sent[b] = sent.get(b, 0) + int(r["n"])
    return progress, sent


TxRow = tuple[str | None, str, int, int, bool, dict[str, int]]
"""(group, broker, check-backs, own check-backs, checked or discarded, sums of the row)."""

_TX_SUMS = ("ntx", "u", "s", "at_send", "again", "caused", "disc", "late", "late2")


def transactions(tx: pa.Table, names: dict[int, str]) -> list[TxRow]:
    """The transaction rows of ``reduce.result`` with their groups named."""
    return [
        (
            None if r["gh"] is None else names.get(r["gh"]),
            r["txb"],
            int(r["c"]),
            int(r["own"]),
            bool(r["inc"]),
            {k: int(r[k] or 0) for k in _TX_SUMS},
        )
        for r in tx.select(["gh", "txb", "c", "own", "inc", *_TX_SUMS]).to_pylist()
    ]


def histogram(rows: list[TxRow]) -> list[tuple[Any, str, int, int, int, int]]:
    """(group, broker, checks, transactions, of them ever UNKNOW, checks sent)."""
    out: dict[tuple[Any, str, int], list[int]] = {}
    for grp, broker, c, _own, _inc, v in rows:
        acc = out.setdefault((grp, broker, c), [0, 0, 0])
        acc[0] += v["ntx"]
        acc[1] += v["u"]
        acc[2] += v["s"]
    return [(g, b, c, n, u, s) for (g, b, c), (n, u, s) in out.items()]


def after_end(rows: list[TxRow]) -> list[tuple[Any, str, int, int, int, int, int, int]]:
    """Transactions checked after they had ended, per (group, broker, own check-backs).

    Rows (group, broker, the transaction's own check-backs, transactions, of them checked after
    a logged first-phase end, of them checked again after a COMMIT/ROLLBACK check answer,
    check-backs the broker caused, discards of ended transactions), over the transactions that
    were checked or discarded; the rules are in ``summary.AFTER_END_RULES``.
    """
    out: dict[tuple[Any, str, int], list[int]] = {}
    for grp, broker, _c, own, inc, v in rows:
        if not inc:
            continue
        acc = out.setdefault((grp, broker, own), [0, 0, 0, 0, 0])
        for i, k in enumerate(("ntx", "at_send", "again", "caused", "disc")):
            acc[i] += v[k]
    return [(g, b, own, *acc) for (g, b, own), acc in out.items()]


def late(rows: list[TxRow], name: str = "late") -> dict[tuple[str, str], int]:
    """Per (group, broker): transactions checked back before any end record of their own
    (``late``), and of them those answered COMMIT/ROLLBACK more than once (``late2``)."""
    out: dict[tuple[str, str], int] = {}
    for grp, broker, _c, _own, _inc, v in rows:
        if grp is not None and v[name]:
            out[(grp, broker)] = out.get((grp, broker), 0) + v[name]
    return out


def windows(rows: pa.Table, window: str, tz: timezone) -> pa.Table:
    """Per group, broker and window: the metrics, the window start in UTC.

    ``rows``: the windows rows with a ``broker`` column (a broker's files summed)."""
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    names = [name for name, _ in R.METRICS]
    w = rows.group_by(["grp", "broker", "win"], use_threads=False).aggregate(
        [(name, "sum") for name in names]
    )
    offset = int((tz.utcoffset(None) or UTC.utcoffset(None)).total_seconds())
    local = pc.strptime(w["win"], format=WINDOW_FORMATS[window], unit="us", error_is_null=True)
    start = pc.cast(
        pc.subtract(pc.cast(local, pa.int64()), offset * 1_000_000), pa.timestamp("us", tz="UTC")
    )
    return pa.table(
        {
            "group": w["grp"],
            "broker": w["broker"],
            "window_start": start,
            "window": pa.array([window] * w.num_rows, pa.string()),
            **{name: pc.cast(w[f"{name}_sum"], pa.int64()) for name in names},
        }
    )
