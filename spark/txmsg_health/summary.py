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


def _empty_counts() -> dict[str, int]:
    return defaultdict(int)


def build(
    totals: Iterable[tuple[str | None, str, int, str | None, str | None]],
    by_address: Iterable[tuple[str, str, str, int]],
    histogram: Iterable[tuple[str, int, int, int]],
    *,
    window: str,
    tz: timezone,
    thresholds: Thresholds,
) -> dict[str, Any]:
    """Assemble the summary.

    ``totals``: (group, kind, lines, first and last time as "<window key>|<seconds into it>"
    in broker time), group None for noise lines.
    ``by_address``: (group, address, kind, lines).
    ``histogram``: (group, check answers of one transaction, transactions, of them ever UNKNOW).
    """
    kinds: dict[str, dict[str, int]] = defaultdict(_empty_counts)
    spans: dict[str, list[str]] = {}
    lines: dict[str, int] = defaultdict(int)
    for grp, kind, n, wmin, wmax in totals:
        lines[kind] += n
        if grp is None:
            continue
        kinds[grp][kind] += n
        if wmin is not None and wmax is not None:
            span = spans.setdefault(grp, [wmin, wmax])
            span[0], span[1] = min(span[0], wmin), max(span[1], wmax)

    addrs: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(_empty_counts))
    for grp, addr, kind, n in by_address:
        addrs[grp][addr][kind] += n

    hist: dict[str, dict[int, int]] = defaultdict(dict)
    unknown_tx: dict[str, int] = defaultdict(int)
    overall_hist: dict[int, int] = defaultdict(int)
    for grp, checks, ntx, nunk in histogram:
        unknown_tx[grp] += nunk
        if checks > 0:
            hist[grp][checks] = hist[grp].get(checks, 0) + ntx
            overall_hist[checks] += ntx

    groups: dict[str, Any] = {}
    for grp in sorted(kinds):
        groups[grp] = _group(grp, kinds[grp], spans.get(grp), addrs.get(grp, {}), hist.get(grp, {}),
                             unknown_tx.get(grp, 0), window, tz, thresholds)
    flagged = sorted((g for g, v in groups.items() if v["flagged"]),
                     key=lambda g: (-len(groups[g]["reasons"]), -groups[g]["unknown"], g))
    total = sum(lines.values())
    return {
        "flagged": flagged,
        "groups": groups,
        "lines": {
            "total": total,
            "transaction": total - lines[P.OTHER] - lines[P.UNSTAMPED] - lines[P.BAD],
            "other": lines[P.OTHER],
            "unstamped": lines[P.UNSTAMPED],
            "bad": lines[P.BAD],
            "bad_without_group": lines[P.BAD] - sum(g["bad_lines"] for g in groups.values()),
            "by_kind": {k: lines[k] for k in P.ALL_KINDS if lines.get(k)},
        },
        "checks_histogram": {str(k): overall_hist[k] for k in sorted(overall_hist)},
        "window": window,
        "tz": _tz_text(tz),
        "thresholds": thresholds.as_dict(),
    }


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


def _group(
    grp: str,
    c: dict[str, int],
    span: list[str] | None,
    addrs: dict[str, dict[str, int]],
    hist: dict[int, int],
    unknown_tx: int,
    window: str,
    tz: timezone,
    t: Thresholds,
) -> dict[str, Any]:
    commits_visible = any(c[k] for k in P.DEBUG_KINDS)
    unknown, rollback = c[P.FIRST_UNKNOWN], c[P.FIRST_ROLLBACK]
    commit = c[P.FIRST_COMMIT] if commits_visible else None
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
        "checked_transactions": checked,
        "checks_per_transaction": (checks / checked) if checked else None,
        "max_checks_per_transaction": max(hist) if hist else 0,
        "checks_histogram": {str(k): hist[k] for k in sorted(hist)},
        "transactions_with_unknown": unknown_tx,
        "discarded": c[P.DISCARD],
        "no_channel": max(c[P.NO_CHANNEL], c[P.NO_CHANNEL_BROKER_LOG]),
        "check_send_failed": c[P.CHECK_SEND_FAILED],
        "bad_lines": c[P.BAD],
        "first_seen": first,
        "last_seen": last,
        "active_minutes": round(active, 2),
        "unknown_per_minute": (unknown / active) if active else 0.0,
        "addresses": {a: _addr_entry(addrs[a]) for a in sorted(addrs)},
    }
    g["reasons"] = evaluate(g, t)
    g["flagged"] = bool(g["reasons"])
    return g
