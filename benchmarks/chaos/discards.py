"""What the brokers discarded during a chaos run, and what txmsg's rescuer made of it.

Why: a broker checks a pending transaction back ``transactionCheckMax`` times and then moves the
half message to ``TRANS_CHECK_MAX_TIME_TOPIC`` for good (docs/rocketmq-facts.md, "What a discard
stores").  The chaos run gives its broker a short horizon (:data:`benchmarks.chaos.run.
BROKER_SETTINGS`), so strikes that keep every producer of the group down for a few seconds make
discards; the databases then prove whether any committed order was lost, and these figures say
how many half messages were discarded and how many of them the rescuer (:mod:`txmsg.rescue`)
re-sent or resolved.

Both are read from places that survive ``kill -9``, on the embedded brokers and on a real cluster
alike:

* **discards**: the discard topic itself, on every master the name server lists
  (``GET_BROKER_CLUSTER_INFO``): its max offset (one queue per broker) and the ``UNIQ_KEY`` of each
  stored copy (a raw PULL), so copies of one transaction discarded twice count once as a
  transaction;
* **rescues**: the service processes' logs, where the rescuer writes one line per discarded half
  message it handled (logger ``txmsg.rescue``, naming the transaction key): ``rescued`` after the
  re-send (``check_local`` said COMMIT), ``rolled back`` (ROLLBACK), ``put back into the broker's
  check cycle`` (UNKNOW: sent again as a half message carrying ``TXMSG_RESCUED_FROM``, checked
  back by the broker; discarded again, it is back in the topic under that key).
  A process's in-memory counters (``TxMsg.rescuers``, ``txmsg.discards``) die with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from txmsg_broker import fastjson
from txmsg_broker.codec import (
    GET_BROKER_CLUSTER_INFO,
    GET_MAX_OFFSET,
    PULL_MESSAGE,
    SUCCESS,
)
from txmsg_broker.message_codec import decode_messages
from txmsg_broker.rawclient import call

DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
RESCUE_LOGGER = "txmsg.rescue"
#: PullSysFlag.FLAG_SUBSCRIPTION: the pull names its subscription, so no consumer group must exist
_PULL_WITH_SUBSCRIPTION = 0x4
_PULL_GROUP = "TxmsgChaosDiscardReader"
#: the original transaction's key on a half message the rescuer sent again (txmsg.message)
RESCUED_FROM = "TXMSG_RESCUED_FROM"
#: outcome words of the rescuer's lines, the most specific first (a give-up line quotes its
#: reason): given up (a dead row), put back into the broker's check cycle after UNKNOW (its
#: check-backs decide; a new discard comes back to the rescuer), acknowledged after ROLLBACK,
#: re-sent after COMMIT
_OUTCOMES = (
    ("gave up", "dead"),
    ("put back into the broker's check cycle", "put_back"),
    ("rolled back", "rolled_back"),
    ("rescued", "rescued"),
)
RESCUED_OUTCOMES = frozenset({"rescued", "rolled_back", "put_back"})


@dataclass
class DiscardFigures:
    """The discard topic of every broker, and the rescuer's outcome per discarded transaction."""

    copies: dict[str, int] = field(default_factory=dict)
    """broker name -> half messages it moved to the discard topic (the topic's max offset)."""
    keys: set[str] = field(default_factory=set)
    """The transaction key of every discarded copy (``TXMSG_RESCUED_FROM`` of a copy the rescuer
    had put back, else its ``UNIQ_KEY``): the discarded transactions."""
    outcomes: dict[str, str] = field(default_factory=dict)
    """discarded transaction key -> the rescuer's last outcome for it: ``rescued`` (re-sent after
    COMMIT), ``rolled_back``, ``put_back`` (UNKNOW: into the broker's check cycle again) or
    ``dead`` (given up)."""
    unreadable: list[str] = field(default_factory=list)
    """Brokers whose discard topic could not be read (named with the reason)."""

    @property
    def discards(self) -> int:
        """Half messages the brokers discarded (copies; one transaction can be discarded twice)."""
        return sum(self.copies.values())

    @property
    def rescues(self) -> int:
        """Discarded transactions the rescuer re-sent, resolved as rolled back, or put back into
        the broker's check cycle (whose check-backs then decided: a copy discarded again would
        be back in the topic and in the rescuer's lines)."""
        return sum(1 for o in self.outcomes.values() if o in RESCUED_OUTCOMES)

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)

    @property
    def pending(self) -> set[str]:
        """Discarded transactions the rescuer has not handled yet (no outcome at all)."""
        return self.keys - set(self.outcomes)

    @property
    def unrescued(self) -> set[str]:
        """Discarded transactions without a rescue outcome (not handled yet, or given up)."""
        return {k for k in self.keys if self.outcomes.get(k) not in RESCUED_OUTCOMES}

    def per_broker(self) -> str:
        return ", ".join(f"{name} {n}" for name, n in sorted(self.copies.items())) or "-"


def masters(name_server: str) -> dict[str, str]:
    """broker name -> master address, as the name server lists them."""
    response = call(name_server.split(";", maxsplit=1)[0].strip(), GET_BROKER_CLUSTER_INFO)
    if response.code != SUCCESS:
        raise RuntimeError(
            f"name server {name_server} refused cluster info: {response.code} {response.remark}"
        )
    table = fastjson.loads(response.body).get("brokerAddrTable", {})
    found = {}
    for name, data in table.items():
        addrs = data.get("brokerAddrs", {})
        addr = addrs.get("0") or addrs.get(0)
        if addr:
            found[str(name)] = str(addr)
    return found


def _max_offset(broker_addr: str) -> int:
    response = call(broker_addr, GET_MAX_OFFSET, {"topic": DISCARD_TOPIC, "queueId": "0"})
    # no such topic (no discard yet on that broker): nothing discarded
    return int(response.ext_fields.get("offset", "0")) if response.code == SUCCESS else 0


def _keys(broker_addr: str, start: int, upto: int) -> set[str]:
    keys: set[str] = set()
    offset = start
    while offset < upto:
        response = call(
            broker_addr,
            PULL_MESSAGE,
            {
                "consumerGroup": _PULL_GROUP,
                "topic": DISCARD_TOPIC,
                "queueId": "0",
                "queueOffset": str(offset),
                "maxMsgNums": "32",
                "sysFlag": str(_PULL_WITH_SUBSCRIPTION),
                "commitOffset": "0",
                "suspendTimeoutMillis": "0",
                "subscription": "*",
                "subVersion": "0",
                "expressionType": "TAG",
            },
        )
        messages = decode_messages(response.body) if response.code == SUCCESS else []
        if not messages:
            break
        keys.update(m.properties.get(RESCUED_FROM) or m.uniq_key for m in messages)
        offset = int(response.ext_fields.get("nextBeginOffset", offset + len(messages)))
    return keys


def baseline(name_server: str) -> dict[str, int]:
    """broker name -> its discard topic's max offset now: what a run against an external cluster
    must not count (that topic keeps the discards of every earlier run); empty when unreadable."""
    try:
        return {name: _max_offset(addr) for name, addr in masters(name_server).items()}
    except (OSError, RuntimeError, ValueError):
        return {}


def read(name_server: str, logs: Path, since: dict[str, int] | None = None) -> DiscardFigures:
    """The figures of a run: the brokers' discard topics (past ``since``, see :func:`baseline`),
    then the rescuer's lines in ``logs``."""
    figures = DiscardFigures()
    try:
        brokers = masters(name_server)
    except (OSError, RuntimeError) as exc:
        figures.unreadable.append(f"name server {name_server}: {exc}")
        return figures
    for name, addr in brokers.items():
        start = (since or {}).get(name, 0)
        try:
            upto = _max_offset(addr)
            figures.copies[name] = max(0, upto - start)
            figures.keys |= _keys(addr, start, upto)
        except (OSError, ValueError) as exc:
            figures.unreadable.append(f"{name} ({addr}): {exc}")
    figures.outcomes = rescue_outcomes(_lines(logs), figures.keys)
    return figures


def _lines(logs: Path) -> Iterable[str]:
    if not logs.is_dir():
        return
    for path in sorted(logs.glob("*.log")):
        with path.open(errors="replace") as fh:
            for line in fh:
                if RESCUE_LOGGER in line:
                    yield line


_TOKEN = re.compile(r"[0-9A-Za-z_-]{16,}")


def rescue_outcomes(lines: Iterable[str], keys: set[str]) -> dict[str, str]:
    """discarded key -> outcome, from the rescuer's log lines (a line naming a key and an outcome
    word; the last outcome wins, a key handled again after a restart keeps one entry)."""
    found: dict[str, str] = {}
    for line in lines:
        outcome = next((name for word, name in _OUTCOMES if word in line), None)
        if outcome is None:
            continue
        for token in _TOKEN.findall(line):
            if token in keys:
                found[token] = outcome
    return found
