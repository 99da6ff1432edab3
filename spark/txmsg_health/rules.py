"""Flagging rules: when a producer group's numbers mean someone should look at it.

Why these five (plus one about the broker, ``summary.broker_findings``): a check-back that never reaches the producer is the most common complaint about
RocketMQ transactions, and the broker says so in its own words (no channel for the group, or the
send failed), so any such line flags the group by default. Then: a producer that leaves transactions UNKNOW makes the broker check back, delays
delivery and finally discards messages. The share of UNKNOW first-phase answers is the honest
measure, but it needs the COMMIT count, which the broker logs only at DEBUG; without it an
absolute rate (UNKNOW transactions per minute) is the fallback. Any discard is data that never
reached a consumer, and many checks per transaction means a slow or broken checker.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """Configurable limits; a group is flagged when any limit is exceeded.

    The defaults flag a group whose transactions are 40 % UNKNOW and leave one at 1 % alone.
    """

    max_unknown_share: float = 0.10
    """UNKNOW first-phase answers / all first-phase answers, used when COMMITs are visible."""
    min_transactions: int = 10
    """Fewer first-phase answers than this make the share too noisy to judge."""
    max_unknown_per_minute: float = 5.0
    """UNKNOW first-phase answers per minute of the group's activity, when COMMITs are not visible."""
    max_discards: int = 0
    """Messages discarded after the maximum number of checks."""
    max_checks_per_transaction: float = 3.0
    """Mean check answers per checked transaction."""
    max_ended_checked: int | None = 0
    """Transactions a broker checked back after they had ended (a first-phase COMMIT/ROLLBACK
    logged, or a check answered COMMIT/ROLLBACK, before the check): above this, a broker finding
    (``summary.broker_findings``). None turns it off."""
    max_ended_checked_share: float = 0.05
    """...and above this share of the transactions the broker checked back: a broker that checks
    an ended transaction now and then (an answer and the next pass within one second, whose op
    record was not written yet: seen on a real 5.3.3 with a 500 ms op batch, 2 of 71) is not
    misconfigured."""
    max_undelivered_checks: int | None = 0
    """Check-backs that never reached a producer of the group ("channel is null" / "channel table
    is empty": none connected; "invoke producer exception": the send failed). None turns it off."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(g: dict[str, Any], t: Thresholds) -> list[str]:
    """Return one human-readable reason per rule the group trips (empty: healthy).

    ``g`` is a group entry of ``summary.json`` (``unknown``, ``commit``, ``unknown_share``, ...).
    """
    reasons: list[str] = []
    share = g.get("unknown_share")
    first = g.get("transactions")
    if share is not None and first is not None:
        if first >= t.min_transactions and share > t.max_unknown_share:
            reasons.append(
                f"unknown_share: {share:.1%} of {first} transactions were UNKNOW at send "
                f"(limit {t.max_unknown_share:.1%})"
            )
    else:
        broker_share = g.get("undecided_share_of_broker")
        if broker_share is not None:
            half = g["half_messages"]
            if half >= t.min_transactions and broker_share > t.max_unknown_share:
                reasons.append(
                    f"unknown_share: {g['undecided']} of the {half} transactions its brokers took "
                    f"in ({broker_share:.1%}) were UNKNOW at send or checked back before they "
                    "ended; first-phase answers are not logged on RocketMQ 5, so the brokers' half "
                    "messages are the base: a lower bound where groups share a broker "
                    f"(limit {t.max_unknown_share:.1%})"
                )
        rate = g.get("unknown_per_minute") or 0.0
        if rate > t.max_unknown_per_minute:
            reasons.append(
                f"unknown_rate: {rate:.1f} UNKNOW transactions per minute over "
                f"{g.get('active_minutes', 0):.1f} min; COMMITs not logged (INFO level), so the share "
                f"is unknown (limit {t.max_unknown_per_minute:g}/min)"
            )
    # checks and discards of transactions that had already ended are the broker's (a broker
    # finding, summary.broker_findings), not this group's
    by_broker = g.get("broker_caused_discards", 0)
    discarded = g.get("discarded", 0) - by_broker
    if discarded > t.max_discards:
        more = f"; {by_broker} more of ended transactions, the broker's" if by_broker else ""
        reasons.append(
            f"discards: {discarded} messages discarded after the maximum number of checks "
            f"(limit {t.max_discards}{more})"
        )
    own = "own_checks_per_transaction" in g
    cpt = g.get("own_checks_per_transaction" if own else "checks_per_transaction")
    if cpt is not None and cpt > t.max_checks_per_transaction:
        top = g.get("own_max_checks_per_transaction" if own else "max_checks_per_transaction")
        caused = g.get("broker_caused_checks", 0)
        more = f"; {caused} more check-backs of ended transactions, the broker's" if caused else ""
        reasons.append(
            f"checks_per_transaction: {cpt:.2f} check-backs per checked transaction, "
            f"max {top} (limit {t.max_checks_per_transaction:g}{more})"
        )
    undelivered = g.get("undelivered_checks", 0)
    if t.max_undelivered_checks is not None and undelivered > t.max_undelivered_checks:
        reasons.insert(0, never_arrives_reason(g, t.max_undelivered_checks))
    return reasons


def never_arrives_reason(g: dict[str, Any], limit: int) -> str:
    """The check-back-never-arrives finding in plain words."""
    parts = []
    if g.get("no_channel"):
        parts.append(
            f"no producer of this group was connected when the broker tried to check back "
            f'{g["no_channel"]} times ("channel is null" / "channel table is empty")'
        )
    if g.get("check_send_failed"):
        parts.append(
            f"{g['check_send_failed']} check-backs could not be sent to a connected producer "
            f'("invoke producer exception")'
        )
    return (
        f"check_never_arrives: {'; '.join(parts)}; the transactions stay undecided, are checked "
        f"again every check interval and are discarded after the check maximum (limit {limit})"
    )
