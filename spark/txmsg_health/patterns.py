"""How one broker log line becomes one classified row, as Spark SQL expressions.

Why this shape (measured on this machine, 2 cores, see benchmarks/health_vs_duckdb.py): every line
is classified with ``contains`` only, a first-byte scan over Spark's UTF-8 buffer that costs about
as much as reading the line; ``instr``/``locate`` walk the line character by character and were ~4x
slower per call, so positions are never searched. Only transaction lines (about half) then pay for
fields: the header is cut out by one regex that starts with a literal (the engine skips ahead with
Boyer-Moore, one decode of the line) and split at its commas, instead of one regex per field
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
  ``transactionId`` (neither empty nor ``null``) marks it as check-phase;
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

from typing import Final

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
CHECK_SENT: Final = "S"  # 5.x INFO "Check transaction. real_topic=...,uniqKey=..." (group joined later)
BAD: Final = "bad"  # carries a transaction marker but a field is missing or malformed
OTHER: Final = "other"  # a well-formed log line that is not about transactions
UNSTAMPED: Final = "unstamped"  # no timestamp: stack traces, wrapped text, foreign or binary lines

CHECK_KINDS: Final = (CHECK_UNKNOWN, CHECK_ROLLBACK, CHECK_COMMIT, CHECK_COMMIT_DEBUG)
DEBUG_KINDS: Final = (FIRST_COMMIT, CHECK_COMMIT_DEBUG, DEBUG_OTHER)
UNKNOWN_KINDS: Final = (FIRST_UNKNOWN, CHECK_UNKNOWN)
# Kinds whose msgId is kept for the per-transaction join (UNKNOW ever, checks per transaction).
MSG_KINDS: Final = (FIRST_UNKNOWN, *CHECK_KINDS, DISCARD, CHECK_SENT)
# Kinds whose msgId names the transaction's group, for attributing 5.x check-sent lines.
OWNER_KINDS: Final = (FIRST_UNKNOWN, *CHECK_KINDS, DISCARD)
ALL_KINDS: Final = (
    FIRST_UNKNOWN, FIRST_ROLLBACK, FIRST_COMMIT, *CHECK_KINDS, DEBUG_OTHER, DISCARD,
    NO_CHANNEL, NO_CHANNEL_BROKER_LOG, CHECK_SEND_FAILED, CHECK_SENT, BAD, OTHER, UNSTAMPED,
)
# Check-backs that never reached a producer (no channel, or the send failed).
UNDELIVERED_KINDS: Final = (NO_CHANNEL, NO_CHANNEL_BROKER_LOG, CHECK_SEND_FAILED)

HEADER: Final = "EndTransactionRequestHeader{"
DISCARD_MARK: Final = "has been checked too many times"
CHECK_FAILED: Final = "Check transaction failed"
CHECK_LINE: Final = "Check transaction"  # common prefix of the failure and 5.x check-sent lines
CHECK_SENT_MARK: Final = "Check transaction. real_topic="

WINDOW_CHARS: Final = {"minute": 16, "hour": 13}  # "yyyy-MM-dd HH:mm" / "yyyy-MM-dd HH"


def _sq(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _rx(value: str, pattern: str, group: int = 1) -> str:
    """``regexp_extract`` with a Java pattern; '' when it does not match."""
    return f"regexp_extract({value}, {_sq(pattern)}, {group})"


STAMPED: Final = (
    "(substr(value, 5, 1) = '-' AND substr(value, 11, 1) = ' ' "
    "AND substr(value, 14, 1) = ':' AND substr(value, 20, 1) = ' ')"
)
"""The timestamp's shape. Tried instead: ``locate('-', value, 5) = 5 AND ...`` (no copy per test):
no gain, since both walk the line character by character up to the position, which is most of the
cost (JFR, 2 M lines: the four ``locate`` calls 8.7 % of the scan's samples, the four ``substr``
6.6-7.6 %)."""

# One small pattern per field, each starting with a literal so the regex engine skips ahead.
RX_HEADER_BODY: Final = r"EndTransactionRequestHeader\{([^}]*\}?)"  # up to and with the first "}"
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


def _offset(window: str) -> str:
    sec = "try_cast(substr(value, 18, 2) AS INT)"
    return sec if window == "minute" else f"try_cast(substr(value, 15, 2) AS INT) * 60 + {sec}"




def stage0() -> list[str]:
    return ["value", f"{STAMPED} AS stamped"]


def stage1() -> list[str]:
    """Classify every line with plain substring tests (``contains`` is a fast byte scan)."""
    cls = (
        f"CASE WHEN contains(value, {_sq(HEADER)}) THEN 'H' "
        f"WHEN contains(value, {_sq(CHECK_LINE)}) THEN "
        f"  CASE WHEN contains(value, {_sq(CHECK_SENT_MARK)}) THEN '{CHECK_SENT}' "
        f"       WHEN contains(value, 'channel is null. groupId=') THEN '{NO_CHANNEL}' "
        f"       WHEN contains(value, 'channel table is empty. groupId=') THEN '{NO_CHANNEL_BROKER_LOG}' "
        f"       WHEN contains(value, 'invoke producer exception. group=') THEN '{CHECK_SEND_FAILED}' "
        f"       WHEN stamped THEN '{OTHER}' ELSE '{UNSTAMPED}' END "
        f"WHEN contains(value, {_sq(DISCARD_MARK)}) THEN '{DISCARD}' "
        f"WHEN stamped THEN '{OTHER}' ELSE '{UNSTAMPED}' END AS cls"
    )
    return ["value", "stamped", cls]


HEADER_FIELDS: Final = ("producerGroup=", " tranStateTableOffset=", " commitLogOffset=",
                         " commitOrRollback=", " fromTransactionCheck=", " msgId=", " transactionId=")
"""The header's fields in the order both 4.9.x and 5.x print them (4.9.5+ add `` bname=``)."""


def stage2(window: str) -> list[str]:
    """Cut the header body out with one literal-prefixed regex and split it at commas.

    ``RX_HEADER_BODY`` starts with "EndTransactionRequestHeader{", so Java's regex engine skips to
    it (Boyer-Moore) and then runs one ``[^}]*`` loop; it replaced ``substring_index`` (which
    Spark implements as a full byte compare at *every* position, backwards from the line's end
    for the header and forwards for "}": ~20 % of the scan's CPU time, measured with JFR) and
    before that a regex with seven ``[^,]*`` loops. Field values never contain a comma (group
    names are ``[%|a-zA-Z0-9_-]``, ids are hex), so the split is exact; ``stage2b`` checks every
    field name in order and that the header was not cut off, so a reordered or truncated header
    is counted as bad. DEBUG lines carry no producer address and skip that regex.
    """
    n = WINDOW_CHARS[window]
    return [
        "value",
        "cls",
        "stamped",
        f"CASE WHEN cls = 'H' THEN {_rx('value', RX_HEADER_BODY)} END AS rest",
        f"CASE WHEN cls = '{DISCARD}' THEN {_rx('value', RX_PGROUP)} "
        f"WHEN cls IN ('{NO_CHANNEL}', '{NO_CHANNEL_BROKER_LOG}') THEN {_rx('value', RX_GROUP_ID)} "
        f"WHEN cls = '{CHECK_SEND_FAILED}' THEN {_rx('value', RX_FAIL_GROUP)} END AS grp0",
        f"CASE WHEN cls = 'H' AND substr(value, 21, 6) <> 'DEBUG ' THEN {_rx('value', RX_ADDR)} "
        f"WHEN cls = '{DISCARD}' THEN {_rx('value', RX_BORN)} END AS addr",
        f"CASE WHEN cls = '{DISCARD}' THEN {_rx('value', RX_UNIQ)} "
        f"WHEN cls = '{CHECK_SENT}' THEN {_rx('value', RX_UNIQ_KEY)} END AS msg0",
        f"CASE WHEN cls NOT IN ('{OTHER}', '{UNSTAMPED}') AND stamped "
        f"THEN substr(value, 1, {n}) END AS win",
        # seconds since the window's start: min/max of a small int keep Spark's hash
        # aggregation (a string min/max forces a sort of every row); window + offset = timestamp
        f"CASE WHEN cls NOT IN ('{OTHER}', '{UNSTAMPED}') AND stamped THEN {_offset(window)} END AS ts",
        "cls = 'H' AND substr(value, 21, 6) = 'DEBUG ' AS dbg",
    ]


def stage2a() -> list[str]:
    """Split the header at commas; ``closed``: the header's "}" was found (the body keeps it)."""
    return [
        "value", "cls", "grp0", "addr", "msg0", "win", "ts", "dbg",
        "CASE WHEN cls = 'H' THEN split(rest, ',') END AS f",
        "CASE WHEN cls = 'H' THEN endswith(rest, '}') END AS closed",
    ]


def stage2b() -> list[str]:
    """Check the header's shape once (``ok``) and cut the raw field values out of it.

    ``ok``: every field name in order and the header not cut off. It is used by every field
    below, so it is a column of its own: written inline, Spark evaluated the eight tests once per
    expression using it (seven times per header line; subexpressions inside ``CASE``/``AND`` branches
    are not shared), as it does for the raw values, used twice each.
    """
    names = " AND ".join(f"startswith(get(f, {i}), {_sq(n)})" for i, n in enumerate(HEADER_FIELDS))
    # 7 fields and a closing "}", or more (4.9.5+ bname) after the transactionId's comma
    ok = f"(cls = 'H' AND (size(f) >= 8 OR (size(f) = 7 AND closed)) AND {names})"
    return ["value", "cls", "grp0", "addr", "msg0", "win", "ts", "dbg", f"{ok} AS ok", "f"]


def stage2c() -> list[str]:
    """The raw values of the fields used (group, commitOrRollback, fromTransactionCheck, msgId,
    transactionId), each cut once: the group's is read twice below (value and format)."""
    def raw(i: int) -> str:  # the value after "name=", still quoted (4.9) or with the last "}"
        return f"CASE WHEN ok THEN substr(get(f, {i}), {len(HEADER_FIELDS[i]) + 1}) END AS f{i}"

    return ["value", "cls", "grp0", "addr", "msg0", "win", "ts", "dbg", "ok",
            *(raw(i) for i in (0, 3, 4, 5, 6))]


def stage2d() -> list[str]:
    """Name the header fields, quotes and the closing "}" trimmed."""
    def field(i: int) -> str:
        return f"btrim(f{i}, \"'}}\")"

    return [
        "cls",
        f"CASE WHEN cls = 'H' THEN CASE WHEN ok THEN {field(0)} "
        f"  ELSE {_rx('value', RX_GROUP)} END ELSE grp0 END AS grp",
        "addr",
        f"CASE WHEN cls = 'H' THEN CASE WHEN ok THEN {field(5)} END ELSE msg0 END AS msg",
        "win",
        "ts",
        f"CASE WHEN ok THEN {field(3)} ELSE '' END AS st",
        f"CASE WHEN ok THEN {field(4)} ELSE '' END AS ftc",
        f"CASE WHEN ok THEN {field(6)} END AS tid",
        "CASE WHEN ok THEN 'x' ELSE '' END AS tidm",
        "dbg",
        # 4.9.x quotes the group ("producerGroup='g'"), 5.x does not
        f"CASE WHEN ok THEN CASE WHEN startswith(f0, \"'\") THEN '4.9' "
        f"ELSE '5' END WHEN cls = '{CHECK_SENT}' THEN '5' END AS v",
    ]


def stage3() -> list[str]:
    """Decide the row kind; a transaction marker with a missing field becomes ``bad``."""
    check = "(ftc = 'true' OR tid NOT IN ('', 'null'))"
    kind = (
        "CASE "
        f"WHEN cls IN ('{OTHER}', '{UNSTAMPED}') THEN cls "
        f"WHEN win IS NULL OR ((grp IS NULL OR grp = '') AND cls <> '{CHECK_SENT}') THEN '{BAD}' "
        f"WHEN cls <> 'H' THEN CASE WHEN cls IN ('{DISCARD}', '{CHECK_SENT}') AND (msg IS NULL OR msg = '') "
        f"  THEN '{BAD}' ELSE cls END "
        f"WHEN st = '' OR msg = '' OR tidm = '' OR ftc NOT IN ('true', 'false') "
        f"  OR (NOT dbg AND addr = '') THEN '{BAD}' "
        f"WHEN dbg THEN CASE "
        f"  WHEN st NOT IN ('0', '8', '12') THEN '{BAD}' "
        f"  WHEN st = '8' AND ftc = 'false' "
        f"    THEN CASE WHEN {check} THEN '{CHECK_COMMIT_DEBUG}' ELSE '{FIRST_COMMIT}' END "
        f"  ELSE '{DEBUG_OTHER}' END "
        f"WHEN {check} THEN CASE st WHEN '0' THEN '{CHECK_UNKNOWN}' "
        f"  WHEN '12' THEN '{CHECK_ROLLBACK}' WHEN '8' THEN '{CHECK_COMMIT}' ELSE '{BAD}' END "
        f"ELSE CASE st WHEN '0' THEN '{FIRST_UNKNOWN}' WHEN '12' THEN '{FIRST_ROLLBACK}' "
        f"  WHEN '8' THEN '{FIRST_COMMIT}' ELSE '{BAD}' END "
        "END"
    )
    return [f"{kind} AS kind", "grp", "addr", "win", "ts", "msg", "v"]


def stage4() -> list[str]:
    """Keep only the keys each kind needs, so the aggregate stays small."""
    keep_msg = ", ".join(f"'{k}'" for k in MSG_KINDS)
    return [
        "kind",
        f"CASE WHEN kind NOT IN ('{OTHER}', '{UNSTAMPED}') THEN grp END AS grp",
        f"CASE WHEN kind NOT IN ('{OTHER}', '{UNSTAMPED}', '{BAD}') AND addr <> '' THEN addr END AS addr",
        f"CASE WHEN kind NOT IN ('{OTHER}', '{UNSTAMPED}') THEN win END AS win",
        f"CASE WHEN kind NOT IN ('{OTHER}', '{UNSTAMPED}', '{BAD}') THEN ts END AS ts",
        f"CASE WHEN kind IN ({keep_msg}) THEN msg END AS msg",
        f"CASE WHEN kind NOT IN ('{OTHER}', '{UNSTAMPED}', '{BAD}') THEN v END AS v",
        # the file, not the broker: one hash key per row here, the broker name is derived from
        # the few distinct paths after the aggregation (no regex per line)
        "input_file_name() AS file",
    ]


def pipeline(window: str) -> list[list[str]]:
    """The projections the job applies in order; each stage reuses the previous stage's columns."""
    if window not in WINDOW_CHARS:
        raise ValueError(f"window must be one of {sorted(WINDOW_CHARS)}, not {window!r}")
    return [stage0(), stage1(), stage2(window), stage2a(), stage2b(), stage2c(), stage2d(), stage3(),
            stage4()]
