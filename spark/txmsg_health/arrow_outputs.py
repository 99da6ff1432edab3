"""Every output of the job from the aggregate collected as Arrow: the local-mode path.

Why: in local mode the driver *is* the executor, so after the one scan there is nothing to
distribute. The Spark path caches the aggregate and runs three more small jobs over it (totals,
per-transaction figures, the window table); each fresh query is analysed, optimised, compiled by
Janino and run by a JVM that has not warmed that code up yet, and the cache itself is built
while the scan runs (docs/health.md, round 5). Here the aggregate (one row per group, kind,
window and file, plus one per UNKNOW/checked transaction: 621 763 rows for 10 M generated lines)
comes to Python once through ``toArrow()`` and pyarrow's hash aggregations derive the same
figures in tens of milliseconds. The results are the Spark path's (``job._outputs_spark``), row
for row; ``tests/health/test_arrow_outputs.py`` runs both on the same logs and compares them.
"""

from __future__ import annotations

from datetime import UTC, timezone
from typing import TYPE_CHECKING, Any

from txmsg_health import patterns as P
from txmsg_health.summary import WINDOW_FORMATS

if TYPE_CHECKING:
    import pyarrow as pa


def prefer_jemalloc(environ: dict[str, str] | None = None) -> None:
    """For a one-shot process: pyarrow's jemalloc pool instead of its default (mimalloc).

    Why: a fresh process's first hash aggregations over the aggregate cost 1.15 s of CPU with
    mimalloc against 0.57 s with jemalloc (0.41 and 0.48 s once warm; 10 M lines, docs/health.md
    round 5); a command-line run only ever makes the first. A pool chosen by the user
    (``ARROW_DEFAULT_MEMORY_POOL``) is kept, and so is the default where pyarrow has no jemalloc
    (Windows, some macOS builds).
    """
    import os  # noqa: PLC0415 - only here

    import pyarrow as pa  # noqa: PLC0415 - the spark extra

    if (environ if environ is not None else os.environ).get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # pyarrow.lib.ArrowNotImplementedError: built without jemalloc
        return


def files(agg: pa.Table) -> list[str]:
    """The distinct files of the aggregate's rows, sorted."""
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    return sorted(pc.unique(agg["file"]).to_pylist())


def with_broker(agg: pa.Table, names: dict[str, str]) -> pa.Table:
    """The aggregate with a ``broker`` column: each row's file named by ``names``."""
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    files = sorted(names)
    index = pc.index_in(agg["file"], value_set=pa.array(files, pa.string()))
    broker = pc.take(pa.array([names[f] for f in files], pa.string()), index)
    return agg.append_column("broker", broker)


def totals(agg: pa.Table) -> list[Any]:
    """Lines, first and last stamp per (group, file, address, kind, format): ``job``'s totals rows.

    Returned as dicts with the Spark rows' field names (``grp``, ``file``, ``addr``, ``kind``,
    ``v``, ``n``, ``wmin``, ``wmax``) so the caller treats both paths alike.
    """
    import pyarrow as pa  # noqa: PLC0415 - the spark extra

    t = pa.table(
        {
            "grp": agg["grp"],
            "file": agg["file"],
            "addr": agg["addr"],
            "kind": agg["kind"],
            "v": agg["v"],
            "n": agg["n"],
            "wmin": _stamp(agg, "tmin"),
            "wmax": _stamp(agg, "tmax"),
        }
    )
    out = (
        t.group_by(["grp", "file", "addr", "kind", "v"], use_threads=False)
        .aggregate([("n", "sum"), ("wmin", "min"), ("wmax", "max")])
        .rename_columns(["grp", "file", "addr", "kind", "v", "n", "wmin", "wmax"])
    )
    rows: list[Any] = out.to_pylist()
    return rows


def _stamp(agg: pa.Table, col: str) -> pa.ChunkedArray:
    """``"<window>|<seconds, 4 digits>"``, NULL where the seconds are (``job._stamp``)."""
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    seconds = pc.utf8_lpad(pc.cast(agg[col], pa.string()), width=4, padding="0")
    stamp: pa.ChunkedArray = pc.binary_join_element_wise(agg["win"], seconds, "|")
    return stamp


def histogram(agg: pa.Table) -> list[tuple[Any, str, int, int, int, int]]:
    """(group, broker, checks, transactions, of them ever UNKNOW, checks sent): ``job._histogram``."""
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    t = agg.filter(pc.is_valid(agg["msg"]))
    kind, n = t["kind"], t["n"]
    zero = pa.scalar(0, pa.int64())
    per = (
        pa.table(
            {
                "broker": t["broker"],
                "msg": t["msg"],
                "grp": t["grp"],
                "a": pc.if_else(pc.is_in(kind, value_set=pa.array(P.CHECK_KINDS)), n, zero),
                "s": pc.if_else(pc.equal(kind, P.CHECK_SENT), n, zero),
                "u": pc.cast(pc.is_in(kind, value_set=pa.array(P.UNKNOWN_KINDS)), pa.int64()),
            }
        )
        .group_by(["broker", "msg"], use_threads=False)
        .aggregate([("grp", "min"), ("a", "sum"), ("s", "sum"), ("u", "max")])
    )
    tx = pa.table(
        {
            "broker": per["broker"],
            "grp": per["grp_min"],
            "c": pc.max_element_wise(per["a_sum"], per["s_sum"]),
            "u": per["u_max"],
            "s": per["s_sum"],
        }
    )
    out = tx.group_by(["broker", "grp", "c"], use_threads=False).aggregate(
        [([], "count_all"), ("u", "sum"), ("s", "sum")]
    )
    return [
        (r["grp"], r["broker"], int(r["c"]), int(r["count_all"]), int(r["u_sum"]), int(r["s_sum"]))
        for r in out.to_pylist()
    ]


def after_end(agg: pa.Table) -> list[tuple[Any, str, int, int, int, int, int, int]]:
    """Transactions checked after they had ended, per (group, broker): ``job._after_end``.

    Rows (group, broker, the transaction's own check-backs, transactions, of them checked after
    a logged first-phase end, of them checked again after a COMMIT/ROLLBACK check answer,
    check-backs the broker caused, discards of ended transactions); the rules are in
    ``summary.AFTER_END_RULES``.
    """
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    t = agg.filter(pc.is_valid(agg["msg"]))
    kind, n = t["kind"], t["n"]
    zero = pa.scalar(0, pa.int64())
    null = pa.scalar(None, pa.string())
    lo, hi = _stamp(t, "tmin"), _stamp(t, "tmax")

    def of(kinds: tuple[str, ...]) -> Any:
        return pc.is_in(kind, value_set=pa.array(kinds))

    per = (
        pa.table(
            {
                "broker": t["broker"],
                "msg": t["msg"],
                "grp": t["grp"],
                "a": pc.if_else(of(P.CHECK_KINDS), n, zero),
                "s": pc.if_else(pc.equal(kind, P.CHECK_SENT), n, zero),
                "k": pc.if_else(of(P.CONCLUSIVE_CHECK_KINDS), n, zero),
                "d": pc.if_else(pc.equal(kind, P.DISCARD), n, zero),
                "end": pc.if_else(of(P.FIRST_END_KINDS), lo, null),
                "concl": pc.if_else(of(P.CONCLUSIVE_CHECK_KINDS), lo, null),
                "sent": pc.if_else(pc.equal(kind, P.CHECK_SENT), hi, null),
                "ans": pc.if_else(of(P.CHECK_KINDS), hi, null),
            }
        )
        .group_by(["broker", "msg"], use_threads=False)
        .aggregate(
            [
                ("grp", "min"),
                *((c, "sum") for c in ("a", "s", "k", "d")),
                ("end", "min"),
                ("concl", "min"),
                ("sent", "max"),
                ("ans", "max"),
            ]
        )
    )
    checks = pc.max_element_wise(per["a_sum"], per["s_sum"])
    k, d = per["k_sum"], per["d_sum"]
    last = pc.coalesce(per["sent_max"], per["ans_max"])
    at_send = pc.fill_null(pc.greater(last, per["end_min"]), False)
    again = pc.and_(
        pc.invert(at_send), pc.fill_null(pc.greater(per["sent_max"], per["concl_min"]), False)
    )
    one = pa.scalar(1, pa.int64())
    caused = pc.if_else(
        at_send,
        checks,
        pc.if_else(again, pc.max_element_wise(pc.subtract(k, one), one), zero),
    )
    tx = pa.table(
        {
            "broker": per["broker"],
            "grp": per["grp_min"],
            "own": pc.subtract(checks, caused),
            "at_send": pc.cast(at_send, pa.int64()),
            "again": pc.cast(again, pa.int64()),
            "caused": caused,
            "disc": pc.if_else(pc.or_(at_send, again), d, zero),
        }
    ).filter(pc.or_(pc.greater(checks, zero), pc.greater(d, zero)))
    out = tx.group_by(["broker", "grp", "own"], use_threads=False).aggregate(
        [([], "count_all"), *((c, "sum") for c in ("at_send", "again", "caused", "disc"))]
    )
    return [
        (
            r["grp"],
            r["broker"],
            int(r["own"]),
            int(r["count_all"]),
            int(r["at_send_sum"]),
            int(r["again_sum"]),
            int(r["caused_sum"]),
            int(r["disc_sum"]),
        )
        for r in out.to_pylist()
    ]


def windows(
    agg: pa.Table, metrics: list[tuple[str, tuple[str, ...]]], window: str, tz: timezone
) -> pa.Table:
    """Per group, broker and window: the metrics, the window start in UTC (``job.windows_table``)."""
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    t = agg.filter(pc.and_(pc.is_valid(agg["grp"]), pc.is_valid(agg["win"])))
    zero = pa.scalar(0, pa.int64())
    cols: dict[str, Any] = {"grp": t["grp"], "broker": t["broker"], "win": t["win"]}
    for name, kinds in metrics:
        cols[name] = pc.if_else(pc.is_in(t["kind"], value_set=pa.array(kinds)), t["n"], zero)
    names = [name for name, _ in metrics]
    w = (
        pa.table(cols)
        .group_by(["grp", "broker", "win"], use_threads=False)
        .aggregate([(name, "sum") for name in names])
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
            **{name: w[f"{name}_sum"] for name in names},
        }
    )
