"""The Spark side of the job: broker log lines in, a result whose size does not grow with them.

Why this shape: a day of broker logs is tens of millions of lines and millions of transactions,
and a local-mode driver has Spark's default 1 GB. So nothing per line or per transaction ever
reaches the driver: one pass over the lines feeds two groupings at once (Spark's grouping sets,
one shuffle), and a second, map-side-combined aggregation reduces the per-transaction rows to
counts per (broker, group, check-backs, own check-backs). What comes back is bounded by groups x
windows x files (the line rows) plus groups x brokers x a few check counts (the transaction
rows): 10 M or 50 M lines give the same kind of result, only more windows.

* Line rows, keyed (kind, group, address, window, format, file): lines, first and last second.
  Totals, per-address figures and the window table are sums of these (``outputs``).
* Transaction rows, keyed (broker, msgId): what the transaction's lines say, as numbers only
  (check answers, check-sent lines, conclusive answers, discards, ever UNKNOW, and the stamps of
  its first-phase end, first conclusive answer, first and last check). Numbers only, because a
  string in an aggregation buffer (``min(group)``) turns Spark's hash aggregation into a sort;
  the group is carried as its 64-bit hash and named again on the driver from the line rows.

Every column of both kinds of row merges by sum, min or max (``MERGES``), so live mode
(``follow``) keeps them as its state and merges each batch in with ``merge``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txmsg_health import patterns as P

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

LINE_KEYS = ("kind", "grp", "addr", "win", "v", "file")
"""The key of a line row (``mh`` and ``txb`` NULL)."""
TX_KEYS = ("txb", "mh")
"""The key of a transaction row: broker and msgId (the ``LINE_KEYS`` NULL)."""
KEYS = (*LINE_KEYS, *TX_KEYS)

MERGES: dict[str, str] = {
    "n": "sum",  # lines of a line row
    "tmin": "min",  # first and last second into the window, of a line row
    "tmax": "max",
    "omin": "min",  # half-queue progress (msgOffset) of the check service's passes, line rows
    "omax": "max",
    "gh": "max",  # xxhash64 of the transaction's group (NULL: only 5.x check-sent lines)
    "a": "sum",  # check answers
    "s": "sum",  # 5.x check-sent lines
    "k": "sum",  # conclusive (COMMIT/ROLLBACK) check answers
    "d": "sum",  # discards
    "u": "max",  # ever UNKNOW (first phase or a check answer)
    "fend": "min",  # stamp of the first logged first-phase end
    "concl": "min",  # stamp of the first conclusive check answer
    "chk": "min",  # stamp of the first check (a check-sent line or, without one, an answer)
    "sent": "max",  # stamp of the last check-sent line
    "ans": "max",  # stamp of the last check answer
}
"""How each value column of the aggregate merges: one definition for the pass over the lines and
for live mode's merge of a batch into its state."""

STAMP_SCALE = 10_000
"""A stamp is the window key's digits x 10 000 + seconds into the window: "2026-11-22 18:12" and
second 4 -> 2026112218120004. Ordered like the time within one run (one window length), and a
long, so Spark aggregates it in its hash map."""


def window_number(win: Column) -> Column:
    """The window key's digits as a long ("2026-11-22 18:12" -> 202611221812; an hour key has
    10 digits), NULL where they are not digits.

    Why not ``translate`` + one cast: Spark's ``translate`` cost 5 s of a 9 s pass over 2 M lines
    (docs/health.md); five fixed-position substrings cost almost nothing.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import LongType  # noqa: PLC0415 - optional: the spark extra

    def part(pos: int, n: int) -> Column:
        return F.substring(win, pos, n).try_cast(LongType())

    hour = part(1, 4) * 1_000_000 + part(6, 2) * 10_000 + part(9, 2) * 100 + part(12, 2)
    return F.when(F.length(win) > 13, hour * 100 + part(15, 2)).otherwise(hour)


def _agg_columns(values: dict[str, Column] | None = None) -> list[Column]:
    """The aggregate's value columns, over ``values`` (per-line inputs) or over themselves."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    fns = {"sum": F.sum, "min": F.min, "max": F.max}
    return [
        fns[how](values[name] if values else F.col(name)).alias(name)
        for name, how in MERGES.items()
    ]


def aggregate(lines: DataFrame, broker: Column) -> DataFrame:
    """Line rows and transaction rows of ``lines`` (``patterns.pipeline``'s output), one shuffle.

    ``broker``: the broker of a line, an expression over its ``file`` (the batch job names the
    files before reading them; live mode names its staged files by their source).
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import IntegerType  # noqa: PLC0415 - the spark extra

    kind, msg, ts = F.col("kind"), F.col("msg"), F.col("ts")
    tx = msg.isNotNull()
    # the msgId as its 64-bit hash: a long key hashes and shuffles cheaper than a 32-character
    # string (a collision among 4 M transactions: odds ~1 in 2 million)
    mh = F.when(tx, F.xxhash64(msg))
    stamp = F.when(tx & ts.isNotNull(), window_number(F.col("win")) * STAMP_SCALE + ts)

    def count_of(*kinds: str) -> Column:
        return F.when(tx & kind.isin(*kinds), F.lit(1)).otherwise(F.lit(0))

    def stamp_of(*kinds: str) -> Column:
        return F.when(kind.isin(*kinds), stamp)

    values = {
        "n": F.lit(1),
        "tmin": ts,
        "tmax": ts,
        "omin": F.col("off"),
        "omax": F.col("off"),
        "gh": F.when(tx & F.col("grp").isNotNull(), F.xxhash64(F.col("grp"))),
        "a": count_of(*P.CHECK_KINDS),
        "s": count_of(P.CHECK_SENT),
        "k": count_of(*P.CONCLUSIVE_CHECK_KINDS),
        "d": count_of(P.DISCARD),
        "u": count_of(*P.UNKNOWN_KINDS).cast(IntegerType()),
        "fend": stamp_of(*P.FIRST_END_KINDS),
        "concl": stamp_of(*P.CONCLUSIVE_CHECK_KINDS),
        "chk": stamp_of(*P.CHECK_KINDS, P.CHECK_SENT),
        "sent": stamp_of(P.CHECK_SENT),
        "ans": stamp_of(*P.CHECK_KINDS),
    }
    prepared = lines.select(
        *[F.col(c) for c in LINE_KEYS if c != "file"],
        F.col("file"),
        mh.alias("mh"),
        broker.alias("txb"),
        *[v.alias(f"_{k}") for k, v in values.items()],
    )
    grouped = prepared.groupingSets(
        [list(LINE_KEYS), list(TX_KEYS)], *[F.col(c) for c in KEYS]
    ).agg(*_agg_columns({k: F.col(f"_{k}") for k in values}))
    # the transaction grouping set also yields one (broker, NULL) row of the lines without a msgId
    return grouped.where(kind.isNotNull() | F.col("mh").isNotNull())


def merge(rows: DataFrame) -> DataFrame:
    """Rows of ``aggregate`` merged by their key: live mode's state plus a batch."""
    return rows.groupBy(*KEYS).agg(*_agg_columns())


METRICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("unknown", (P.FIRST_UNKNOWN,)),
    ("rollback", (P.FIRST_ROLLBACK,)),
    ("commit", (P.FIRST_COMMIT,)),
    ("check_unknown", (P.CHECK_UNKNOWN,)),
    ("check_rollback", (P.CHECK_ROLLBACK,)),
    ("check_commit", (P.CHECK_COMMIT, P.CHECK_COMMIT_DEBUG)),
    ("checks", P.CHECK_KINDS),
    ("discarded", (P.DISCARD,)),
    ("no_channel", (P.NO_CHANNEL,)),
    ("no_channel_broker_log", (P.NO_CHANNEL_BROKER_LOG,)),
    ("check_send_failed", (P.CHECK_SEND_FAILED,)),
    ("bad_lines", (P.BAD,)),
    ("debug_lines", P.DEBUG_KINDS),
)
"""The window table's columns: lines of these kinds per group, broker and window."""

TOTALS, WINDOWS, TRANSACTIONS = 0, 1, 2
"""The three kinds of row of ``result`` (its ``set`` column)."""
_SETS: tuple[tuple[str, ...], ...] = (
    ("kind", "grp", "lh", "addr", "v", "file"),
    ("grp", "win", "file"),
    ("txb", "gh", "c", "own", "inc"),
)


def result(agg: DataFrame) -> DataFrame:
    """The small result, in three kinds of row (``set``), from one more aggregation.

    * ``TOTALS``, per (kind, group, address, format, file): lines, first and last stamp, and the
      half queue's progress (``HALF_PROGRESS`` lines): no window, so few rows;
    * ``WINDOWS``, per (group, window, file): the ``METRICS`` (groups x windows x files rows);
    * ``TRANSACTIONS``: each transaction row made its figures (the rules are
      ``summary.AFTER_END_RULES`` and ``LATE_RULE``), counted per (broker, group hash, check-backs,
      own check-backs, checked or discarded).

    The totals carry each group's hash (``lh``) so the driver names the transactions' groups.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import LongType  # noqa: PLC0415 - optional: the spark extra

    def c_(name: str) -> Column:
        return F.col(name)

    line, tx = c_("kind").isNotNull(), c_("mh").isNotNull()
    checks = F.greatest(c_("a"), c_("s"))
    last = F.coalesce(c_("sent"), c_("ans"))
    at_send = F.coalesce(last > c_("fend"), F.lit(False))
    again = ~at_send & F.coalesce(c_("sent") > c_("concl"), F.lit(False))
    caused = (
        F.when(at_send, checks)
        .when(again, F.greatest(c_("k") - 1, F.lit(1)))
        .otherwise(F.lit(0))
        .cast(LongType())
    )
    late = (checks > 0) & (c_("fend").isNull() | (c_("chk") < c_("fend")))
    # ... and answered COMMIT/ROLLBACK more than once: on a broker that checks ended transactions
    # (summary.LATE_RULE) the sign that the producer, not the broker, was late
    late2 = late & (c_("k") >= 2)
    win_digits = window_number(c_("win")) * STAMP_SCALE

    def on_tx(col: Column) -> Column:
        return F.when(tx, col.cast(LongType()))

    def on_line(col: Column) -> Column:
        return F.when(line, col)

    shaped = agg.select(
        *[c_(k) for k in LINE_KEYS],
        on_line(F.when(c_("grp").isNotNull(), F.xxhash64(c_("grp")))).alias("lh"),
        c_("txb"),
        F.when(tx, c_("gh")).alias("gh"),
        on_tx(checks).alias("c"),
        on_tx(checks - caused).alias("own"),
        F.when(tx, (checks > 0) | (c_("d") > 0)).alias("inc"),
        on_line(c_("n")).alias("n"),
        on_line(win_digits + c_("tmin")).alias("smin"),
        on_line(win_digits + c_("tmax")).alias("smax"),
        on_line(c_("omin")).alias("omin"),
        on_line(c_("omax")).alias("omax"),
        *[
            on_line(F.when(c_("kind").isin(*kinds), c_("n")).otherwise(F.lit(0))).alias(name)
            for name, kinds in METRICS
        ],
        on_tx(F.lit(1)).alias("ntx"),
        on_tx(c_("u")).alias("u"),
        on_tx(c_("s")).alias("s"),
        on_tx(at_send).alias("at_send"),
        on_tx(again).alias("again"),
        on_tx(caused).alias("caused"),
        on_tx(F.when(at_send | again, c_("d")).otherwise(F.lit(0))).alias("disc"),
        on_tx(late).alias("late"),
        on_tx(late2).alias("late2"),
    )
    keys = list(dict.fromkeys(k for keys in _SETS for k in keys))
    sums = ("n", *(name for name, _ in METRICS), "ntx", "u", "s")
    sums += ("at_send", "again", "caused", "disc", "late", "late2")
    grouped = shaped.groupingSets([list(k) for k in _SETS], *[c_(k) for k in keys]).agg(
        *[F.sum(k).alias(k) for k in sums],
        F.min("smin").alias("smin"),
        F.max("smax").alias("smax"),
        F.min("omin").alias("omin"),
        F.max("omax").alias("omax"),
        F.grouping_id().alias("gid"),
    )
    # which set a row is of: its grouping id has a 0 bit for each key it is grouped by
    ids = {
        sum(1 << (len(keys) - 1 - i) for i, k in enumerate(keys) if k not in ks): n
        for n, ks in enumerate(_SETS)
    }
    kind_of = F.create_map(*[F.lit(x) for kv in sorted(ids.items()) for x in kv])[c_("gid")]
    wanted = (
        ((kind_of == TOTALS) & line_present("kind"))
        | ((kind_of == WINDOWS) & line_present("grp") & line_present("win"))
        | ((kind_of == TRANSACTIONS) & line_present("txb"))
    )
    return grouped.withColumn("set", kind_of).where(wanted).drop("gid")


def line_present(col: str) -> Column:
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    return F.col(col).isNotNull()
