"""Turn the job's small aggregates into the per-group figures of ``summary.json``.

Why on the driver in plain Python: after Spark has reduced the logs to counts per
(group, kind), (group, address, kind) and (group, checks-per-transaction) there are at most a few
thousand rows; deriving shares, rates and reasons from them is clearer here than in SQL.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from txmsg_health import patterns as P
from txmsg_health.rules import Thresholds, evaluate

WINDOW_FORMATS = {"minute": "%Y-%m-%d %H:%M", "hour": "%Y-%m-%d %H"}


def window_to_utc(win: str, window: str, tz: timezone) -> datetime:
    """A window key in broker-local time ("2026-11-22 18:12") as an aware UTC datetime."""
    local = datetime.strptime(win, WINDOW_FORMATS[window]).replace(tzinfo=tz)
    return local.astimezone(UTC)


def stamp_to_utc(stamp: str, window: str, tz: timezone) -> datetime:
    """``"<window key>|<seconds into the window>"`` (broker-local) as an aware UTC datetime."""
    win, _, offset = stamp.partition("|")
    return window_to_utc(win, window, tz) + timedelta(seconds=int(offset or 0))


def _empty_counts() -> defaultdict[str, int]:
    return defaultdict(int)


Totals = tuple[str | None, str, str, str | None, int, str | None, str | None]
"""(group, broker, kind, format, lines, first and last "<window key>|<seconds into it>")."""


AfterEnd = tuple[str | None, str, int, int, int, int, int, int]
"""(group, broker, the transaction's own check-backs, transactions, of them checked after a logged
first-phase end, of them checked again after a COMMIT/ROLLBACK check answer, check-backs the
broker caused, discards of ended transactions): ``arrow_outputs.after_end`` / ``job._after_end``."""

AFTER_END_RULES = """How a transaction checked after it had ended is told from the logs (per broker and msgId).

* Checked after its first-phase end: a first-phase ROLLBACK (or, at DEBUG, COMMIT) is logged and
  a check-back of the same transaction is logged at a later second. Every check-back of it is
  the broker's doing: the producer had answered.
* Checked again after a check answer: a check-back answered COMMIT or ROLLBACK, and a 5.x
  ``Check transaction. real_topic=...,uniqKey=...`` line for the same transaction at a later
  second (the check was *sent* after the answer). The broker's check-backs are the COMMIT/ROLLBACK
  answers after the first, at least one. Without the 5.x check-sent lines (4.9.x at INFO) two
  answers may only mean a slow checker (the second check was sent before the first answer came):
  not counted.
* A discard of a transaction found by one of the two is the broker's too. Not a discard after a
  COMMIT answer alone: on a real 4.9.8 broker a slow C++ checker's COMMIT came after the broker had
  already re-put the half message for the next check, which was then discarded - the checker's
  slowness, not the broker's setting.
The transaction's own check-backs are the others: what the producer's UNKNOW answers (or its
silence) cost. Timestamps have one-second resolution, so an event within the same second as the
end is not counted: the figures are a lower bound."""


LATE_RULE = """A transaction checked back before any end record of its own counts against its group.

Its first check-back (a 5.x check-sent line, or the first check answer where none is logged) came
before any first-phase COMMIT/ROLLBACK of it was logged: the producer had not ended it when the
broker's transactionTimeOut ran out, whatever it answered later. On RocketMQ 5 this is the only
trace of a local transaction slower than the first phase: a 5.x client sends nothing for an UNKNOW
at send, logs nothing for a COMMIT, and its check answer is COMMIT. Counted per broker and msgId;
a check within the same second as the end is not counted (a lower bound, as AFTER_END_RULES).
A committed transaction that a misconfigured broker checked (its op record still in the batch) looks
the same where first-phase COMMITs are not logged. So on a broker with that finding
(``broker_findings``) only the late transactions answered COMMIT/ROLLBACK more than once count:
such a broker checks a transaction committed at send about once (its op record, written at send,
lands before the next pass), but one the producer ended only at its check again (that answer's op
record comes one op batch later). A heuristic, measured on real 5.3.3 logs (transactionTimeOut 2000
< op batch 3000, the producers' truth per msgId): 62 of 71 transactions left UNKNOW at send were
answered COMMIT twice or more, and 10 of the 43 checked after they had ended at send; per group
the errors partly cancel (counted 7 and 64 against 7 and 64 truly slow)."""


def build(
    totals: Iterable[Totals],
    by_address: Iterable[tuple[str, str, str, str, int]],
    histogram: Iterable[tuple[str | None, str, int, int, int, int]],
    *,
    window: str,
    tz: timezone,
    thresholds: Thresholds,
    after_end: Iterable[AfterEnd] | None = None,
    late: dict[tuple[str, str], int] | None = None,
    late_again: dict[tuple[str, str], int] | None = None,
    half_messages: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Assemble the summary.

    ``totals``: (group, broker, kind, format "4.9"/"5"/None, lines, first and last time as
    "<window key>|<seconds into it>" in broker time); group None for noise lines and for 5.x
    5.x check-sent lines (their group comes with ``histogram``).
    ``by_address``: (group, broker, address, kind, lines).
    ``histogram``: (group, broker, check-backs of one transaction, transactions, of them ever UNKNOW,
    5.x check-sent lines of those transactions); group None: check-sent lines whose transaction
    appears on no other line of that broker.
    ``late``: per (group, broker), transactions checked back before any end record of their own
    (``LATE_RULE``); ``late_again``: of them, those answered COMMIT/ROLLBACK more than once.
    ``half_messages``: per broker, the half messages it took in over the logs, where its check
    service logs its progress (RocketMQ 5: ``half_messages``).
    """
    kinds: dict[str, dict[str, defaultdict[str, int]]] = defaultdict(
        lambda: defaultdict(_empty_counts)
    )
    spans: dict[tuple[str, str], list[str]] = {}
    lines: dict[str, int] = defaultdict(int)
    formats: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    broker_lines: dict[str, int] = defaultdict(int)
    broker_formats: dict[str, dict[str, int]] = defaultdict(dict)
    unattributed = 0
    for grp, broker, kind, fmt, n, wmin, wmax in totals:
        lines[kind] += n
        broker_lines[broker] += n
        if fmt:
            broker_formats[broker][fmt] = broker_formats[broker].get(fmt, 0) + n
        if grp is None:
            continue
        kinds[grp][broker][kind] += n
        if fmt:
            formats[grp][broker][fmt] = formats[grp][broker].get(fmt, 0) + n
        if wmin is not None and wmax is not None:
            span = spans.setdefault((grp, broker), [wmin, wmax])
            span[0], span[1] = min(span[0], wmin), max(span[1], wmax)

    addrs: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(_empty_counts))
    for grp, _broker, addr, kind, n in by_address:
        addrs[grp][addr][kind] += n

    hist: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    unknown_tx: dict[tuple[str, str], int] = defaultdict(int)
    overall_hist: dict[int, int] = defaultdict(int)
    for hgrp, broker, checks, ntx, nunk, sent in histogram:
        if hgrp is None:
            unattributed += sent
            continue
        if sent:
            kinds[hgrp][broker][P.CHECK_SENT] += sent
        unknown_tx[(hgrp, broker)] += nunk
        if checks > 0:
            h = hist[(hgrp, broker)]
            h[checks] = h.get(checks, 0) + ntx
            overall_hist[checks] += ntx

    ended: dict[tuple[str, str], dict[str, Any]] | None = None
    if after_end is not None:
        ended = {}
        for agrp, broker, own, ntx, at_send, again, caused, disc in after_end:
            if agrp is None:
                continue
            e = ended.setdefault((agrp, broker), _empty_after_end())
            if own > 0:
                e["own_hist"][own] = e["own_hist"].get(own, 0) + ntx
            e["at_send"] += at_send
            e["again"] += again
            e["caused"] += caused
            e["disc"] += disc

    misconfigured = _misconfigured(ended, hist, thresholds)
    groups: dict[str, Any] = {}
    for grp in sorted(kinds):
        groups[grp] = _with_brokers(
            grp,
            kinds[grp],
            spans,
            addrs.get(grp, {}),
            hist,
            unknown_tx,
            formats[grp],
            window,
            tz,
            thresholds,
            ended,
            late or {},
            half_messages or {},
            misconfigured,
            late_again or {},
        )
    flagged = sorted(
        (g for g, v in groups.items() if v["flagged"]), key=lambda g: _rank(groups[g], g)
    )
    total = sum(lines.values())
    brokers = {
        b: {
            "lines": broker_lines[b],
            "formats": dict(sorted(broker_formats[b].items())),
            "format": _format_name(broker_formats[b]),
            "groups": sum(1 for v in groups.values() if b in v["brokers"]),
            "flagged": [g for g in flagged if b in groups[g]["flagged_brokers"]],
        }
        for b in sorted(broker_lines)
    }
    findings = broker_findings(groups, thresholds)
    for b, info in brokers.items():
        info["half_messages"] = (half_messages or {}).get(b)
    for b, info in brokers.items():
        info["finding"] = next((f["reason"] for f in findings if f["broker"] == b), None)
    return {
        "flagged": flagged,
        "broker_findings": findings,
        "groups": groups,
        "brokers": brokers,
        "lines": {
            "total": total,
            "transaction": total - lines[P.OTHER] - lines[P.UNSTAMPED] - lines[P.BAD],
            "other": lines[P.OTHER],
            "unstamped": lines[P.UNSTAMPED],
            "bad": lines[P.BAD],
            "bad_without_group": lines[P.BAD] - sum(g["bad_lines"] for g in groups.values()),
            "checks_sent_unattributed": unattributed,
            "by_kind": {k: lines[k] for k in P.ALL_KINDS if lines.get(k)},
        },
        "checks_histogram": {str(k): overall_hist[k] for k in sorted(overall_hist)},
        "window": window,
        "tz": _tz_text(tz),
        "thresholds": thresholds.as_dict(),
    }


def half_messages(
    progress: dict[str, tuple[int, int, int]], checks_sent: dict[str, int]
) -> dict[str, int]:
    """Per broker, the half messages it took in over the logs (RocketMQ 5).

    ``progress``: per broker, the check service's passes seen and the least and greatest
    ``msgOffset`` of the half queue they logged; ``checks_sent``: the broker's check-sent lines.
    Every half message takes one offset, and so does every half message the check service puts
    back before it sends a check-back, so the offsets' progress minus the check-backs sent is
    the transactions begun (real 5.3.3 logs: 522 = 274 + 248, 143 = 80 + 63). A broker with fewer
    than two passes, or a progress the check-backs do not explain, has none.
    """
    out: dict[str, int] = {}
    for b, (passes, lo, hi) in progress.items():
        n = hi - lo - checks_sent.get(b, 0)
        if passes >= 2 and n > 0:
            out[b] = n
    return out


def _ended_checked_trips(n: int, checked: int, t: Thresholds) -> bool:
    """A broker checked enough ended transactions to be a finding (``broker_findings``)."""
    if t.max_ended_checked is None or n <= t.max_ended_checked:
        return False
    return n > t.max_ended_checked_share * checked


def _misconfigured(
    ended: dict[tuple[str, str], dict[str, Any]] | None,
    hist: dict[tuple[str, str], dict[int, int]],
    t: Thresholds,
) -> frozenset[str]:
    """Brokers that get a finding: a transaction they checked before any end record of its own
    may have ended (a COMMIT at send is not logged), so ``LATE_RULE`` does not judge there."""
    if ended is None:
        return frozenset()
    n: dict[str, int] = defaultdict(int)
    checked: dict[str, int] = defaultdict(int)
    for (_g, b), e in ended.items():
        n[b] += e["at_send"] + e["again"]
    for (_g, b), h in hist.items():
        checked[b] += sum(h.values())
    return frozenset(b for b in n if _ended_checked_trips(n[b], checked[b], t))


def _empty_after_end() -> dict[str, Any]:
    return {"own_hist": {}, "at_send": 0, "again": 0, "caused": 0, "disc": 0}


def broker_findings(groups: dict[str, Any], t: Thresholds) -> list[dict[str, Any]]:
    """One finding per broker that checked transactions after they had ended (``AFTER_END_RULES``).

    Why a finding of the broker and not of its groups: a producer that answered cannot make the
    broker check again; the broker does when it cannot see the commit/rollback record yet. On
    RocketMQ 5.1+ that is ``transactionTimeOut`` shorter than ``transactionOpBatchInterval``.
    """
    if t.max_ended_checked is None:
        return []
    per: dict[str, dict[str, Any]] = {}
    checked: dict[str, int] = defaultdict(int)
    for name, g in groups.items():
        for b, e in g["brokers"].items():
            checked[b] += e["checked_transactions"]
            n = e["ended_checked_at_send"] + e["ended_checked_again"]
            if not n and not e["broker_caused_discards"]:
                continue
            f = per.setdefault(
                b,
                {
                    "broker": b,
                    "transactions": 0,
                    "checked_after_first_phase_end": 0,
                    "checked_again_after_answer": 0,
                    "check_backs": 0,
                    "discards": 0,
                    "groups": [],
                },
            )
            f["transactions"] += n
            f["checked_after_first_phase_end"] += e["ended_checked_at_send"]
            f["checked_again_after_answer"] += e["ended_checked_again"]
            f["check_backs"] += e["broker_caused_checks"]
            f["discards"] += e["broker_caused_discards"]
            f["groups"].append(name)
    out = []
    for b in sorted(per):
        f = per[b]
        if not _ended_checked_trips(f["transactions"], checked[b], t):
            continue
        f["setting"] = "transactionTimeOut < transactionOpBatchInterval"
        f["reason"] = (
            f"broker {b} checked back {f['transactions']} transactions that had already ended "
            f"({f['checked_after_first_phase_end']} after their first-phase COMMIT/ROLLBACK was "
            f"logged, {f['checked_again_after_answer']} again after a check-back was answered "
            f"COMMIT/ROLLBACK; {f['check_backs']} check-backs, {f['discards']} discards, groups "
            f"{', '.join(f['groups'])}): it does not see the commit/rollback records in time. On "
            f"RocketMQ 5.1+ this is transactionTimeOut shorter than transactionOpBatchInterval "
            f"(default 3000 ms: commit/rollback records are written in batches). Set "
            f"transactionTimeOut above transactionOpBatchInterval (the default 6000 ms) or lower "
            f"transactionOpBatchInterval (e.g. 500). Until then a COMMIT answer to such a check "
            f"delivers the message again, and a rolled-back one answered COMMIT at all: check_local "
            f"must answer ROLLBACK for rolled-back transactions. These check-backs and discards "
            f"are not counted against the producer groups (limit {t.max_ended_checked})"
        )
        out.append(f)
    return out


def _rank(g: dict[str, Any], name: str) -> tuple[int, int, int, str]:
    """Check-backs that never arrive first, then the most rules tripped, then the most UNKNOW."""
    never = any(r.startswith("check_never_arrives:") for r in g["reasons"])
    return (0 if never else 1, -len(g["reasons"]), -g["unknown"], name)


def _format_name(counts: dict[str, int]) -> str | None:
    if not counts:
        return None
    return "+".join(sorted(counts)) if len(counts) > 1 else next(iter(counts))


def _tz_text(tz: timezone) -> str:
    off = tz.utcoffset(None) or timedelta(0)
    minutes = int(off.total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _addr_entry(c: dict[str, int]) -> dict[str, int]:
    return {
        "unknown": c[P.FIRST_UNKNOWN],
        "rollback": c[P.FIRST_ROLLBACK],
        "check_unknown": c[P.CHECK_UNKNOWN],
        "check_rollback": c[P.CHECK_ROLLBACK],
        "check_commit": c[P.CHECK_COMMIT] + c[P.CHECK_COMMIT_DEBUG],
        "checks": sum(c[k] for k in P.CHECK_KINDS),
        "discarded": c[P.DISCARD],
    }


BROKER_FIELDS = (
    "unknown",
    "rollback",
    "commit",
    "checks",
    "checks_sent",
    "checks_per_transaction",
    "discarded",
    "no_channel",
    "check_send_failed",
    "undelivered_checks",
    "unknown_per_minute",
    "checked_before_end",
    "checked_transactions",
    "undecided",
    "undecided_share_of_broker",
    "half_messages",
    "ended_checked_at_send",
    "ended_checked_again",
    "broker_caused_checks",
    "broker_caused_discards",
    "first_seen",
    "last_seen",
    "flagged",
    "reasons",
)


def _with_brokers(
    grp: str,
    per_broker: dict[str, defaultdict[str, int]],
    spans: dict[tuple[str, str], list[str]],
    addrs: dict[str, dict[str, int]],
    hist: dict[tuple[str, str], dict[int, int]],
    unknown_tx: dict[tuple[str, str], int],
    formats: dict[str, dict[str, int]],
    window: str,
    tz: timezone,
    t: Thresholds,
    ended: dict[tuple[str, str], dict[str, Any]] | None = None,
    late: dict[tuple[str, str], int] | None = None,
    half_messages: dict[str, int] | None = None,
    misconfigured: frozenset[str] = frozenset(),
    late_again: dict[tuple[str, str], int] | None = None,
) -> dict[str, Any]:
    """The group over all brokers, plus the same figures and rules per broker."""
    late = late or {}
    again = late_again or {}

    def judged(b: str) -> int:  # LATE_RULE: on a broker with a finding, only the late-again
        return again.get((grp, b), 0) if b in misconfigured else late.get((grp, b), 0)

    half = half_messages or {}
    total: defaultdict[str, int] = defaultdict(int)
    span: list[str] | None = None
    ghist: dict[int, int] = defaultdict(int)
    no_channel = 0
    g_ended = _empty_after_end()
    each: dict[str, Any] = {}
    for b in sorted(per_broker):
        c = per_broker[b]
        for k, n in c.items():
            total[k] += n
        s = spans.get((grp, b))
        if s:
            span = [min(span[0], s[0]), max(span[1], s[1])] if span else list(s)
        h = hist.get((grp, b), {})
        for checks, ntx in h.items():
            ghist[checks] += ntx
        ae = None if ended is None else ended.get((grp, b), _empty_after_end())
        if ae is not None:
            for k in ("at_send", "again", "caused", "disc"):
                g_ended[k] += ae[k]
            for own, ntx in ae["own_hist"].items():
                g_ended["own_hist"][own] = g_ended["own_hist"].get(own, 0) + ntx
        e = _group(
            c,
            s,
            {},
            h,
            unknown_tx.get((grp, b), 0),
            window,
            tz,
            t,
            ended=ae,
            late=late.get((grp, b), 0),
            judged_late=judged(b),
            half_messages=half.get(b),
        )
        no_channel += e["no_channel"]
        e["formats"] = dict(sorted(formats.get(b, {}).items()))
        each[b] = {k: e[k] for k in BROKER_FIELDS}
        each[b]["format"] = _format_name(formats.get(b, {}))
    fmts: dict[str, int] = defaultdict(int)
    for f in formats.values():
        for k, n in f.items():
            fmts[k] += n
    g = _group(
        total,
        span,
        addrs,
        dict(ghist),
        sum(unknown_tx.get((grp, b), 0) for b in per_broker),
        window,
        tz,
        t,
        no_channel=no_channel,
        ended=None if ended is None else g_ended,
        late=sum(late.get((grp, b), 0) for b in per_broker),
        judged_late=sum(judged(b) for b in per_broker),
        half_messages=sum(half[b] for b in per_broker if b in half)
        if all(b in half for b in per_broker)
        else None,
    )
    g["formats"] = dict(sorted(fmts.items()))
    g["brokers"] = each
    flagged_on = [b for b in each if each[b]["flagged"]]
    g["flagged_brokers"] = flagged_on
    if len(each) > 1 and flagged_on:
        if not g["reasons"]:  # a rule trips on one broker although the totals stay below it
            g["reasons"] = [f"{b}: {r}" for b in flagged_on for r in each[b]["reasons"]]
        healthy = [b for b in each if b not in flagged_on]
        if healthy:
            g["reasons"].append(
                f"broker_scope: flagged on {', '.join(flagged_on)} only; healthy on {', '.join(healthy)}"
            )
    elif len(each) > 1 and g["reasons"]:
        g["reasons"].append(
            f"broker_scope: no single broker trips a rule; only the sum over {', '.join(each)} does"
        )
    g["flagged"] = bool(g["reasons"])
    return g


def _group(
    c: defaultdict[str, int],
    span: list[str] | None,
    addrs: dict[str, dict[str, int]],
    hist: dict[int, int],
    unknown_tx: int,
    window: str,
    tz: timezone,
    t: Thresholds,
    no_channel: int | None = None,
    ended: dict[str, Any] | None = None,
    late: int = 0,
    judged_late: int | None = None,
    half_messages: int | None = None,
) -> dict[str, Any]:
    commits_visible = any(c[k] for k in P.DEBUG_KINDS)
    unknown, rollback = c[P.FIRST_UNKNOWN], c[P.FIRST_ROLLBACK]
    commit = c[P.FIRST_COMMIT] if commits_visible else None
    if judged_late is None:
        judged_late = late
    # UNKNOW transactions: first-phase answers, or (5.x gRPC clients send nothing for an UNKNOW
    # at send) transactions answered UNKNOW at a check or checked back before any end record of
    # their own (LATE_RULE; not on a broker that checks ended transactions: broker_findings)
    undecided = max(unknown, unknown_tx, judged_late)
    transactions = unknown + rollback + commit if commit is not None else None
    checks = sum(c[k] for k in P.CHECK_KINDS)
    checked = sum(hist.values())
    first = last = None
    active = 0.0
    if span:
        f, la = stamp_to_utc(span[0], window, tz), stamp_to_utc(span[1], window, tz)
        first, last = f.isoformat(), la.isoformat()
        # at least one minute, so a burst within a second is not read as a huge rate
        active = max(1.0, (la - f).total_seconds() / 60)
    if no_channel is None:
        # one failed check is logged twice when both files are read (transaction.log "channel is
        # null", broker.log "channel table is empty"); per broker the larger count is the events
        no_channel = max(c[P.NO_CHANNEL], c[P.NO_CHANNEL_BROKER_LOG])
    g: dict[str, Any] = {
        "unknown": unknown,
        "rollback": rollback,
        "commit": commit,
        "commits_visible": commits_visible,
        "transactions": transactions,
        "unknown_share": (unknown / transactions) if transactions else None,
        "check_unknown": c[P.CHECK_UNKNOWN],
        "check_rollback": c[P.CHECK_ROLLBACK],
        "check_commit": c[P.CHECK_COMMIT] + c[P.CHECK_COMMIT_DEBUG],
        "checks": checks,
        "checks_sent": c[P.CHECK_SENT],
        "checked_transactions": checked,
        "checks_per_transaction": (sum(k * n for k, n in hist.items()) / checked)
        if checked
        else None,
        "max_checks_per_transaction": max(hist) if hist else 0,
        "checks_histogram": {str(k): hist[k] for k in sorted(hist)},
        "transactions_with_unknown": unknown_tx,
        "discarded": c[P.DISCARD],
        "no_channel": no_channel,
        "check_send_failed": c[P.CHECK_SEND_FAILED],
        "undelivered_checks": no_channel + c[P.CHECK_SEND_FAILED],
        "bad_lines": c[P.BAD],
        "first_seen": first,
        "last_seen": last,
        "active_minutes": round(active, 2),
        "checked_before_end": late,
        "half_messages": half_messages,
        # where the broker's half messages give a share, the rate counts only what the logs say
        # was UNKNOW (first phase, or a check answer): a late transaction is judged by the share
        "unknown_per_minute": (
            (max(unknown, unknown_tx) if commit is None and half_messages else undecided) / active
        )
        if active
        else 0.0,
        "addresses": {a: _addr_entry(addrs[a]) for a in sorted(addrs)},
    }
    # checks and discards of transactions that had already ended are the broker's doing
    # (summary.AFTER_END_RULES): the producer is judged on the rest
    own = hist if ended is None else ended["own_hist"]
    own_checked = sum(own.values())
    g["ended_checked_at_send"] = 0 if ended is None else ended["at_send"]
    g["ended_checked_again"] = 0 if ended is None else ended["again"]
    g["broker_caused_checks"] = 0 if ended is None else ended["caused"]
    g["broker_caused_discards"] = 0 if ended is None else ended["disc"]
    g["own_checks_per_transaction"] = (
        sum(k * n for k, n in own.items()) / own_checked if own_checked else None
    )
    g["own_max_checks_per_transaction"] = max(own) if own else 0
    g["undecided"] = undecided
    g["undecided_share_of_broker"] = (
        undecided / half_messages if commit is None and half_messages else None
    )
    g["reasons"] = evaluate(g, t)
    g["flagged"] = bool(g["reasons"])
    return g
