"""How one broker log line becomes one classified row, as Spark Column expressions.

Why Columns and not SQL text (``selectExpr``): a fresh process parsed the stages' SQL with
Spark's ANTLR parser in a cold JVM, ~12 % of a 50 000-line job's Java samples. Built as Columns,
the plan is the same (analysed, optimised and physical plans compared equal, expression ids aside),
nothing is parsed, and a cold 50 000-line process took 12.0 s instead of 12.8 s (median of six
interleaved runs; docs/health.md). ``_all``/``_any`` nest long AND/OR chains the way the SQL
parser does.

Why bytes in places (round 4, docs/health.md): Spark's string ``substr`` walks the string from
its start character by character, and ``btrim`` with a set allocates per character; the fixed
positions of the line's prefix and the field values after their ASCII names are cut as bytes
instead, each where bytes and characters provably agree, so every line gets the same answer as
the character functions would give (the per-line CPU of the scan: -18 % on 2 M lines).

Why this shape (measured on this machine, 2 cores, see benchmarks/health_vs_duckdb.py): every line
is classified with ``contains`` (a first-byte scan over Spark's UTF-8 buffer that costs about
as much as reading the line; ``instr``/``locate`` walk the line character by character and were ~4x
slower per call, so positions are never searched), except for the header: the regex that cuts the
header body out (it starts with a literal, so Java's engine skips ahead with Boyer-Moore, one
decode of the line) is the header test too, tried on every line: as fast as ``contains`` and one
search instead of two on a header line (round 5: -6 % CPU). Only transaction lines then pay for
fields: the header body is split at its commas, instead of one regex per field
(each decodes the line again; the two designs measured the same here, the header cut keeps the
field order strict, so a reordered or cut header is counted as bad rather than half-read). One
combined pattern with lazy ``.*?`` extracted per field was several times slower
(``docs/rocketmq-facts.md``, scanning logs). Min/max of timestamps are kept as small ints so
Spark keeps its hash aggregation (a string min/max forces a sort of every row: ~25 % slower).

The formats (``docs/rocketmq-facts.md``, transaction log lines), all with the broker's
``%d{yyy-MM-dd HH:mm:ss,GMT+8} %p %t - %m`` prefix:

* WARN ``The producer[ADDR] end transaction in sending message, ...RequestHeader: EndTransactionRequestHeader{...}``
  and ``Check producer[ADDR] transaction state, ...`` (first-phase ROLLBACK/UNKNOW, check answers);
* DEBUG ``Transaction request:EndTransactionRequestHeader{...}`` for every end-transaction request,
  the only place a first-phase COMMIT shows; UNKNOW/ROLLBACK and Java check answers are logged at
  WARN too, so a DEBUG line counts only when it is a COMMIT with ``fromTransactionCheck=false``;
* 4.9.x headers quote strings and end with ``bname='…'``; 5.x headers do not quote and have no bname;
* a C++/Python producer's check answer arrives with ``fromTransactionCheck=false``: a filled
  ``transactionId`` (neither empty nor ``null``) on a line with its empty remark marks it as
  check-phase (``EMPTY_REMARK``);
* ERROR ``MsgExt:… PGROUP=g … UNIQ_KEY=id … has been checked too many times`` (discard);
* WARN ``Check transaction failed, channel is null. groupId=g`` (transaction.log) and the same event
  as ``Check transaction failed, channel table is empty. groupId=g`` in broker.log;
* ERROR ``Check transaction failed because invoke producer exception. group=g, msgId=…`` (broker.log);
* INFO ``Check transaction. real_topic=t,uniqKey=id,offset=n,commitLogOffset=n`` (5.1+, one per
  check-back the broker sends, ``TransactionalMessageCheckService``): no group on the line, so the
  job joins ``uniqKey`` to the group of the same broker's lines with that ``msgId``.

Every row also keeps the file it came from (the broker is derived from the path after the
aggregation, so the per-line cost is one more hash key, not a regex) and the header's format:
``4.9`` (quoted strings) or ``5`` (unquoted, or a 5.x per-check line).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import Column

# Row kinds. Short codes keep the shuffled aggregate small.
FIRST_UNKNOWN: Final = "U"
FIRST_ROLLBACK: Final = "R"
FIRST_COMMIT: Final = "C"  # from a DEBUG line only
CHECK_UNKNOWN: Final = "cU"
CHECK_ROLLBACK: Final = "cR"
CHECK_COMMIT: Final = "cC"  # WARN "Check producer[...] ... commit" (Java clients)
CHECK_COMMIT_DEBUG: Final = "cCd"  # DEBUG line: a C++/Python client's check COMMIT
DEBUG_OTHER: Final = "X"  # DEBUG header line already counted by its WARN twin
DISCARD: Final = "D"
NO_CHANNEL: Final = "N"  # transaction.log
NO_CHANNEL_BROKER_LOG: Final = "Nb"  # broker.log twin of the same event
CHECK_SEND_FAILED: Final = "F"
CHECK_SENT: Final = (
    "S"  # 5.x INFO "Check transaction. real_topic=...,uniqKey=..." (group joined later)
)
HALF_PROGRESS: Final = (
    "O"  # 5.x INFO "After check, MessageQueue [topic=RMQ_SYS_TRANS_HALF_TOPIC, ...] msgOffset=N"
)
BAD: Final = "bad"  # carries a transaction marker but a field is missing or malformed
OTHER: Final = "other"  # a well-formed log line that is not about transactions
UNSTAMPED: Final = "unstamped"  # no timestamp: stack traces, wrapped text, foreign or binary lines

CHECK_KINDS: Final = (CHECK_UNKNOWN, CHECK_ROLLBACK, CHECK_COMMIT, CHECK_COMMIT_DEBUG)
DEBUG_KINDS: Final = (FIRST_COMMIT, CHECK_COMMIT_DEBUG, DEBUG_OTHER)
UNKNOWN_KINDS: Final = (FIRST_UNKNOWN, CHECK_UNKNOWN)
CONCLUSIVE_CHECK_KINDS: Final = (CHECK_ROLLBACK, CHECK_COMMIT, CHECK_COMMIT_DEBUG)
"""Check answers that end the transaction: after one, the broker has no reason to check it again."""
FIRST_END_KINDS: Final = (FIRST_ROLLBACK, FIRST_COMMIT)
"""A first-phase end that is logged (a COMMIT only at DEBUG): after it, no check is due."""
# Kinds whose msgId is kept for the per-transaction join (UNKNOW ever, checks per transaction,
# transactions checked after they had ended: the broker's own doing).
MSG_KINDS: Final = (FIRST_UNKNOWN, *FIRST_END_KINDS, *CHECK_KINDS, DISCARD, CHECK_SENT)
FIRST_COMMIT_KEPT: Final = "5"
"""The format whose DEBUG first-phase COMMIT lines keep their msgId (``stage4``). Why only 5.x:
the msgId serves the rules on transactions checked after they had ended, which a 5.1+ broker
does (op records in batches) and a 4.9 broker does not (it writes the op record at once); and a
DEBUG log's first-phase COMMITs are most of its transactions: keeping the 4.9 ones per
transaction cost 40 % of the job's time on the benchmark's 10 M lines (docs/health.md)."""
# Kinds whose msgId names the transaction's group, for attributing 5.x check-sent lines.
OWNER_KINDS: Final = (FIRST_UNKNOWN, *CHECK_KINDS, DISCARD)
ALL_KINDS: Final = (
    FIRST_UNKNOWN,
    FIRST_ROLLBACK,
    FIRST_COMMIT,
    *CHECK_KINDS,
    DEBUG_OTHER,
    DISCARD,
    NO_CHANNEL,
    NO_CHANNEL_BROKER_LOG,
    CHECK_SEND_FAILED,
    CHECK_SENT,
    HALF_PROGRESS,
    BAD,
    OTHER,
    UNSTAMPED,
)
# Check-backs that never reached a producer (no channel, or the send failed).
UNDELIVERED_KINDS: Final = (NO_CHANNEL, NO_CHANNEL_BROKER_LOG, CHECK_SEND_FAILED)

HEADER: Final = "EndTransactionRequestHeader{"
DISCARD_MARK: Final = "has been checked too many times"
CHECK_FAILED: Final = "Check transaction failed"
CHECK_LINE: Final = "Check transaction"  # common prefix of the failure and 5.x check-sent lines
CHECK_AND_DISCARD: Final = "heck"  # in both CHECK_LINE and DISCARD_MARK
CHECK_SENT_MARK: Final = "Check transaction. real_topic="
HALF_PROGRESS_MARK: Final = "After check, MessageQueue [topic=RMQ_SYS_TRANS_HALF_TOPIC"
"""The check service's line after each pass over the half queue; its ``msgOffset`` is how far the
pass got. Over a log, the half messages the broker took in are that offset's progress minus the
half messages it put back (one per check-back sent): the 5.x figure a transaction share needs
when first-phase COMMITs are not logged (``summary.half_messages``)."""
EMPTY_REMARK: Final = "Remark: "
"""How a line from a C++/Python (librocketmq) producer ends: it sends an empty remark, and it is
the only client whose check answers arrive with ``fromTransactionCheck=false`` (its ``"1"`` is not
``true``), recognisable by their filled ``transactionId``. Every other sender fills the remark: a
Java client and a 5.x proxy in local mode ``null`` (real 5.3.3: a gRPC first-phase ROLLBACK is
logged with its transactionId, ``fromTransactionCheck=false`` and ``Remark: null``), a proxy in
cluster mode ``end transaction from proxy``, a Java client's exception its text. On those lines
``fromTransactionCheck`` is right, and a filled ``transactionId`` is no check mark."""

WINDOW_CHARS: Final = {"minute": 16, "hour": 13}  # "yyyy-MM-dd HH:mm" / "yyyy-MM-dd HH"


# One small pattern per field, each starting with a literal so the regex engine skips ahead.
RX_HEADER_BODY: Final = (
    r"EndTransactionRequestHeader(\{[^}]*\}?)"  # "{" up to and with the first "}"
)
RX_GROUP: Final = r"\{producerGroup='?([^,'}]*)"
RX_STATE: Final = r"commitOrRollback=([0-9]+)"
RX_FTC: Final = r"fromTransactionCheck=([a-z]+)"
RX_MSGID: Final = r" msgId='?([^,'}]*)"
RX_TID: Final = r"transactionId=[^,}]*[,}]"  # whole match: '' means the header was cut off
RX_ADDR: Final = r"producer\[([^\]]*)\]"
RX_PGROUP: Final = r"PGROUP=([^,}]+)"
RX_UNIQ: Final = r"UNIQ_KEY=([^,}]+)"
RX_BORN: Final = r"bornHost=/([^,]+)"
RX_GROUP_ID: Final = r"groupId=(\S+)"
RX_FAIL_GROUP: Final = r"exception\. group=([^,]+)"
RX_UNIQ_KEY: Final = r"uniqKey=([^,]+)"
RX_MSG_OFFSET: Final = r" msgOffset=([0-9]+)"

HEADER_FIELDS: Final = (
    "producerGroup=",
    " tranStateTableOffset=",
    " commitLogOffset=",
    " commitOrRollback=",
    " fromTransactionCheck=",
    " msgId=",
    " transactionId=",
)
"""The header's fields in the order both 4.9.x and 5.x print them (4.9.5+ add `` bname=``)."""
_BODY_FIELDS: Final = ("{" + HEADER_FIELDS[0], *HEADER_FIELDS[1:])  # the body keeps its "{"


def _c(name: str) -> Column:
    """A column of the previous stage (``pyspark`` is imported only once a job runs)."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    return F.col(name)


def _cols(*names: str) -> list[Column]:
    """The previous stage's columns kept as they are."""
    return [_c(n) for n in names]


def _rx(pattern: str, group: int = 1) -> Column:
    """``regexp_extract`` of the line with a Java pattern; '' when it does not match."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    return F.regexp_extract(_c("value"), pattern, group)


def _sub(col: Column, pos: int, length: int) -> Column:
    """``substr(col, pos, length)``, 1-based like SQL."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    return F.substr(col, F.lit(pos), F.lit(length))


def _stamped() -> Column:
    """The timestamp's shape.

    Tried instead: ``locate('-', value, 5) = 5 AND ...`` (no copy per test): no gain, since both
    walk the line character by character up to the position, which is most of the cost (JFR,
    2 M lines: the four ``locate`` calls 8.7 % of the scan's samples, the four ``substr`` 6.6-7.6 %).
    """
    v = _c("value")
    return _all(
        _sub(v, 5, 1) == "-", _sub(v, 11, 1) == " ", _sub(v, 14, 1) == ":", _sub(v, 20, 1) == " "
    )


def _offset(window: str, chars: Callable[[int, int], Column]) -> Column:
    """Seconds since the window's start, read by ``chars`` (``_line_chars`` or ``_prefix_chars``)
    (``try_cast``: a malformed stamp gives NULL, not an error)."""
    from pyspark.sql.types import IntegerType  # noqa: PLC0415 - optional: the spark extra

    sec = chars(18, 2).try_cast(IntegerType())
    return sec if window == "minute" else chars(15, 2).try_cast(IntegerType()) * 60 + sec


def _line_chars(pos: int, length: int) -> Column:
    """Characters of the line by character position (walks the line)."""
    return _sub(_c("value"), pos, length)


def _prefix_chars(pos: int, length: int) -> Column:
    """The same characters read from the prefix bytes (only where they are ASCII, so bytes are
    characters)."""
    from pyspark.sql.types import StringType  # noqa: PLC0415 - optional: the spark extra

    return _bsub(pos, length).cast(StringType())


def _bsub(pos: int, length: int) -> Column:
    """``substr`` of the line's first bytes (column ``pre``): byte positions, no walk over chars."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    return F.substr(_c("pre"), F.lit(pos), F.lit(length))


def _bytes(text: str) -> Column:
    """A binary literal, to compare with ``_bsub``."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    return F.lit(bytearray(text.encode()))


def _trim(x: Column) -> Column:
    """``btrim(x, "'}")`` only where x starts or ends with a quote or brace (5.x values do not):
    Spark's trim with a set walks the whole value and allocates per character."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    edge = _any(x.startswith("'"), x.endswith("'"), x.startswith("}"), x.endswith("}"))
    return F.when(edge, F.btrim(x, F.lit("'}"))).otherwise(x)


def _not_in(col: Column, *values: str) -> Column:
    """``col NOT IN (...)``: NULL when ``col`` is NULL, like the SQL."""
    return ~col.isin(*values)


def _tree(terms: list[Column], op: Callable[[Column, Column], Column]) -> Column:
    """``a AND b AND c ...`` (or ``OR``) as the balanced tree Spark's SQL parser builds for it.

    Python's ``a & b & c`` nests to the left; the parser splits the chain in halves
    (``AstBuilder.reduceToExpressionTree``). Same result and order of evaluation, but this keeps
    the plan, and so the generated per-line code, identical to the former ``selectExpr`` text.
    """
    if len(terms) == 1:
        return terms[0]
    mid = (len(terms) - 1) // 2 + 1
    return op(_tree(terms[:mid], op), _tree(terms[mid:], op))


def _all(*terms: Column) -> Column:
    """``a AND b AND ...`` nested as the SQL parser nests it."""
    return _tree(list(terms), operator.and_)


def _any(*terms: Column) -> Column:
    """``a OR b OR ...`` nested as the SQL parser nests it."""
    return _tree(list(terms), operator.or_)


PREFIX_CHARS: Final = 26
"""Timestamp (20 chars with its space) and level ("DEBUG "): every fixed-position test reads these."""


def stage0() -> list[Column]:
    """The line's first ``PREFIX_CHARS`` characters, as bytes.

    Why: Spark's ``substr`` on a string walks it character by character from its start and
    allocates; the fixed-position tests (timestamp shape, DEBUG, window, seconds) did that six to
    eight times per line (JFR: ``UTF8String.substring`` 18 % of the scan). One walk here, then
    ``substr`` on the bytes is an index. Where the prefix is all ASCII (``asc``: as many bytes as
    characters) byte and character positions agree; any other line takes the character tests, so
    the result is the same for every line.
    """
    from pyspark.sql.types import BinaryType  # noqa: PLC0415 - optional: the spark extra

    return [_c("value"), _sub(_c("value"), 1, PREFIX_CHARS).cast(BinaryType()).alias("pre")]


def stage0b() -> list[Column]:
    """The timestamp test (used by several branches below, so computed once) and ``hb``: the
    header body with its "{", or "" where the line has no header (``RX_HEADER_BODY``)."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    asc = F.octet_length(_c("pre")) == PREFIX_CHARS
    by_bytes = _all(
        _bsub(5, 1) == _bytes("-"),
        _bsub(11, 1) == _bytes(" "),
        _bsub(14, 1) == _bytes(":"),
        _bsub(20, 1) == _bytes(" "),
    )
    return [
        _c("value"),
        _c("pre"),
        asc.alias("asc"),
        F.when(asc, by_bytes).otherwise(_stamped()).alias("stamped"),
        _rx(RX_HEADER_BODY).alias("hb"),
    ]


def stage1() -> list[Column]:
    """Classify every line: a header line by ``hb``, the others with plain substring tests
    (``contains`` is a fast byte scan).

    Each ``contains`` that fails scans the whole line, so the two marks that share "heck"
    ("Check transaction", "has been checked too many times") are tried only on lines containing
    it: a line about nothing here pays two scans instead of three (3 % of the scan's CPU).
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    v, stamped = _c("value"), _c("stamped")
    other = F.when(stamped, OTHER).otherwise(UNSTAMPED)
    check_line = (
        F.when(v.contains(CHECK_SENT_MARK), CHECK_SENT)
        .when(v.contains("channel is null. groupId="), NO_CHANNEL)
        .when(v.contains("channel table is empty. groupId="), NO_CHANNEL_BROKER_LOG)
        .when(v.contains("invoke producer exception. group="), CHECK_SEND_FAILED)
        .when(stamped, OTHER)
        .otherwise(UNSTAMPED)  # flat, not ``other``: one CASE in the plan
    )
    cls = (
        F.when(_c("hb") != "", "H")
        .when(
            v.contains(CHECK_AND_DISCARD),
            F.when(v.contains(CHECK_LINE), check_line)
            .when(v.contains(DISCARD_MARK), DISCARD)
            .when(
                v.contains(HALF_PROGRESS_MARK), F.when(stamped, HALF_PROGRESS).otherwise(UNSTAMPED)
            )
            .otherwise(other),
        )
        .otherwise(other)
    )
    return [v, _c("pre"), _c("asc"), stamped, _c("hb"), cls.alias("cls")]


def stage1b() -> list[Column]:
    """``hdr``: a header line, as a boolean; ``dbg``: a DEBUG header line, tested once (stage 2
    reads it twice).

    Why ``hdr``: every later stage asks "header line?" several times, and ``cls == "H"`` is a
    call comparing bytes each time, as are the tests for the other one-letter classes that a
    header line then fails (they are skipped for it: ``F.when(header, None)``). 2 % less CPU for
    the scan, in three sessions of interleaved runs (docs/health.md, round 5).
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    v, cls = _c("value"), _c("cls")
    debug = F.when(_c("asc"), _bsub(21, 6) == _bytes("DEBUG ")).otherwise(
        _sub(v, 21, 6) == "DEBUG "
    )
    hdr = cls == "H"
    return [
        v,
        _c("pre"),
        _c("asc"),
        _c("stamped"),
        _c("hb"),
        cls,
        hdr.alias("hdr"),
        F.when(hdr, debug).otherwise(False).alias("dbg"),
    ]


def stage2(window: str) -> list[Column]:
    """The header body (``hb``, cut in stage 0b by one literal-prefixed regex), split at commas
    by stage 2a.

    ``RX_HEADER_BODY`` starts with "EndTransactionRequestHeader{", so Java's regex engine skips to
    it (Boyer-Moore) and then runs one ``[^}]*`` loop; it replaced ``substring_index`` (which
    Spark implements as a full byte compare at *every* position, backwards from the line's end
    for the header and forwards for "}": ~20 % of the scan's CPU time, measured with JFR) and
    before that a regex with seven ``[^,]*`` loops. Field values never contain a comma (group
    names are ``[%|a-zA-Z0-9_-]``, ids are hex), so the split is exact; ``stage2b`` checks every
    field name in order and that the header was not cut off, so a reordered or truncated header
    is counted as bad. DEBUG lines carry no producer address and skip that regex.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    n = WINDOW_CHARS[window]
    v, cls, stamped, asc = _c("value"), _c("cls"), _c("stamped"), _c("asc")
    header = _c("hdr")
    event = _not_in(cls, OTHER, UNSTAMPED) & stamped
    return [
        v,
        cls,
        stamped,
        header,
        F.when(header, _c("hb")).alias("rest"),
        F.when(header, None)
        .when(cls == DISCARD, _rx(RX_PGROUP))
        .when(cls.isin(NO_CHANNEL, NO_CHANNEL_BROKER_LOG), _rx(RX_GROUP_ID))
        .when(cls == CHECK_SEND_FAILED, _rx(RX_FAIL_GROUP))
        .alias("grp0"),
        F.when(header & ~_c("dbg"), _rx(RX_ADDR)).when(cls == DISCARD, _rx(RX_BORN)).alias("addr"),
        F.when(header, None)
        .when(cls == DISCARD, _rx(RX_UNIQ))
        .when(cls == CHECK_SENT, _rx(RX_UNIQ_KEY))
        .when(cls == HALF_PROGRESS, _rx(RX_MSG_OFFSET))
        .alias("msg0"),
        F.when(event, F.when(asc, _prefix_chars(1, n)).otherwise(_line_chars(1, n))).alias("win"),
        # seconds since the window's start: min/max of a small int keep Spark's hash
        # aggregation (a string min/max forces a sort of every row); window + offset = timestamp
        F.when(
            event,
            F.when(asc, _offset(window, _prefix_chars)).otherwise(_offset(window, _line_chars)),
        ).alias("ts"),
        _c("dbg"),
    ]


_KEPT: Final = ("value", "cls", "hdr", "grp0", "addr", "msg0", "win", "ts", "dbg")


def stage2a() -> list[Column]:
    """Split the header at commas; ``closed``: the header's "}" was found (the body keeps it)."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    header, rest = _c("hdr"), _c("rest")
    return [
        *_cols(*_KEPT),
        F.when(header, F.split(rest, ",")).alias("f"),
        F.when(header, rest.endswith("}")).alias("closed"),
    ]


def stage2b() -> list[Column]:
    """Check the header's shape once (``ok``) and cut the raw field values out of it.

    ``ok``: every field name in order and the header not cut off. It is used by every field
    below, so it is a column of its own: written inline, Spark evaluated the eight tests once per
    expression using it (seven times per header line; subexpressions inside ``CASE``/``AND`` branches
    are not shared), as it does for the raw values, used twice each.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    f = _c("f")
    # 7 fields and a closing "}", or more (4.9.5+ bname) after the transactionId's comma
    ok = _all(
        _c("hdr"),
        (F.size(f) >= 8) | ((F.size(f) == 7) & _c("closed")),
        *(F.get(f, i).startswith(name) for i, name in enumerate(_BODY_FIELDS)),
    )
    return [*_cols(*_KEPT), ok.alias("ok"), f]


def stage2c() -> list[Column]:
    """The raw values of the fields used (group, commitOrRollback, fromTransactionCheck, msgId,
    transactionId), each cut once: the group's is read twice below (value and format)."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import BinaryType, StringType  # noqa: PLC0415 - optional: the spark extra

    def raw(i: int) -> Column:  # the value after "name=", still quoted (4.9) or with the last "}"
        # cut by byte offset (the names are ASCII): a string substr walks the whole value
        value = F.substr(F.get(_c("f"), i).cast(BinaryType()), F.lit(len(_BODY_FIELDS[i]) + 1))
        return F.when(_c("ok"), value.cast(StringType())).alias(f"f{i}")

    return [*_cols(*_KEPT), _c("ok"), *(raw(i) for i in (0, 3, 4, 5, 6))]


def stage2t() -> list[Column]:
    """The field values with quotes and the closing "}" trimmed, each once (``tid`` reads two of
    them twice: inline, Spark trimmed them again)."""
    return [
        *_cols(*_KEPT),
        _c("ok"),
        _c("f0"),
        *(_trim(_c(f"f{i}")).alias(f"t{i}") for i in (0, 3, 4, 5, 6)),
    ]


def stage2d() -> list[Column]:
    """Name the header fields."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    def field(i: int) -> Column:
        return _c(f"t{i}")

    cls, ok = _c("cls"), _c("ok")
    header = _c("hdr")
    return [
        cls,
        header,
        F.when(header, F.when(ok, field(0)).otherwise(_rx(RX_GROUP)))
        .otherwise(_c("grp0"))
        .alias("grp"),
        _c("addr"),
        F.when(header, F.when(ok, field(5))).otherwise(_c("msg0")).alias("msg"),
        _c("win"),
        _c("ts"),
        F.when(ok, field(3)).otherwise("").alias("st"),
        F.when(ok, field(4)).otherwise("").alias("ftc"),
        # a first-phase answer from a Java client or a 5.x proxy carries its transactionId too:
        # only a line with librocketmq's empty remark is a C++ check answer (EMPTY_REMARK)
        F.when(
            ok,
            F.when(
                ~_c("dbg")
                & (field(4) == "false")
                & _not_in(field(6), "", "null")
                & ~_c("value").endswith(EMPTY_REMARK),
                "",
            ).otherwise(field(6)),
        ).alias("tid"),
        F.when(ok, "x").otherwise("").alias("tidm"),
        _c("dbg"),
        # 4.9.x quotes the group ("producerGroup='g'"), 5.x does not
        F.when(ok, F.when(_c("f0").startswith("'"), "4.9").otherwise("5"))
        .when(~header & (cls == CHECK_SENT), "5")
        .alias("v"),
    ]


def stage3() -> list[Column]:
    """Decide the row kind; a transaction marker with a missing field becomes ``bad``."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    cls, grp, msg, st, ftc = _c("cls"), _c("grp"), _c("msg"), _c("st"), _c("ftc")
    dbg = _c("dbg")
    check = (ftc == "true") | _not_in(_c("tid"), "", "null")

    def by_state(commit: str) -> Column:  # CASE st WHEN '0' ... WHEN '12' ... WHEN '8' ...
        unknown, rollback = (
            (CHECK_UNKNOWN, CHECK_ROLLBACK)
            if commit == CHECK_COMMIT
            else (FIRST_UNKNOWN, FIRST_ROLLBACK)
        )
        return (
            F.when(st == "0", unknown)
            .when(st == "12", rollback)
            .when(st == "8", commit)
            .otherwise(BAD)
        )

    kind = (
        F.when(cls.isin(OTHER, UNSTAMPED), cls)
        .when(
            _c("win").isNull()
            | ((grp.isNull() | (grp == "")) & _not_in(cls, CHECK_SENT, HALF_PROGRESS)),
            BAD,
        )
        .when(
            ~_c("hdr"),
            F.when(
                cls.isin(DISCARD, CHECK_SENT, HALF_PROGRESS) & (msg.isNull() | (msg == "")), BAD
            ).otherwise(cls),
        )
        .when(
            _any(
                st == "",
                msg == "",
                _c("tidm") == "",
                _not_in(ftc, "true", "false"),
                ~dbg & (_c("addr") == ""),
            ),
            BAD,
        )
        .when(
            dbg,
            F.when(_not_in(st, "0", "8", "12"), BAD)
            .when(
                (st == "8") & (ftc == "false"),
                F.when(check, CHECK_COMMIT_DEBUG).otherwise(FIRST_COMMIT),
            )
            .otherwise(DEBUG_OTHER),
        )
        .when(check, by_state(CHECK_COMMIT))
        .otherwise(by_state(FIRST_COMMIT))
    )
    return [kind.alias("kind"), *_cols("grp", "addr", "win", "ts", "msg", "v")]


def stage4() -> list[Column]:
    """Keep only the keys each kind needs, so the aggregate stays small."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import LongType  # noqa: PLC0415 - optional: the spark extra

    kind = _c("kind")
    kept = _not_in(kind, OTHER, UNSTAMPED)
    good = _not_in(kind, OTHER, UNSTAMPED, BAD)
    return [
        kind,
        F.when(kept, _c("grp")).alias("grp"),
        F.when(good & (_c("addr") != ""), _c("addr")).alias("addr"),
        F.when(kept, _c("win")).alias("win"),
        F.when(good, _c("ts")).alias("ts"),
        # a 4.9 broker writes a transaction's op record at once, so it never checks one committed
        # at send: its DEBUG first-phase COMMITs (most of a DEBUG log's transactions) are not
        # kept per transaction (FIRST_COMMIT_KEPT)
        F.when(
            kind.isin(*MSG_KINDS) & ~((kind == FIRST_COMMIT) & (_c("v") != FIRST_COMMIT_KEPT)),
            _c("msg"),
        ).alias("msg"),
        F.when(good, _c("v")).alias("v"),
        # try_cast: a malformed or huge offset gives NULL, not an error (ANSI casts raise)
        F.when(kind == HALF_PROGRESS, _c("msg").try_cast(LongType())).alias("off"),
        # the file, not the broker: one hash key per row here, the broker name is derived from
        # the few distinct paths after the aggregation (no regex per line)
        F.input_file_name().alias("file"),
    ]


def pipeline(window: str) -> list[list[Column]]:
    """The projections the job applies in order (``df.select(*stage)``); each stage reuses the
    previous stage's columns. Needs a SparkSession (the columns are built in its JVM)."""
    if window not in WINDOW_CHARS:
        raise ValueError(f"window must be one of {sorted(WINDOW_CHARS)}, not {window!r}")
    return [
        stage0(),
        stage0b(),
        stage1(),
        stage1b(),
        stage2(window),
        stage2a(),
        stage2b(),
        stage2c(),
        stage2t(),
        stage2d(),
        stage3(),
        stage4(),
    ]
