"""An independent, deliberately simple reading of broker logs for checking the Spark job.

Written differently from ``txmsg_health.patterns`` on purpose: no regexes, the header is split
into ``key=value`` pairs and looked up by name, so a mistake in one implementation does not
repeat in the other.
"""

from __future__ import annotations

import gzip
import os
from collections import defaultdict
from dataclasses import dataclass, field

HEADER = "EndTransactionRequestHeader{"


@dataclass
class Ref:
    total_lines: int = 0
    bad: int = 0
    groups: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )
    debug_groups: set[str] = field(default_factory=set)
    unknown_ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    checks_by_tx: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    by_addr: dict[tuple[str, str], dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )
    # (group, broker) -> counts; broker = the directory holding the file (otherdays/ skipped)
    by_broker: dict[tuple[str, str], dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )
    sent_unattributed: int = 0
    formats: dict[str, set[str]] = field(
        default_factory=lambda: defaultdict(set)
    )  # broker -> formats

    def undelivered(self, g: str) -> int:
        """Per broker the larger of the two no-channel lines (one event, two files), plus failures."""
        total = 0
        for (gg, _b), c in self.by_broker.items():
            if gg == g:
                total += (
                    max(c["no_channel_txlog"], c["no_channel_brokerlog"]) + c["check_send_failed"]
                )
        return total

    def commit(self, g: str) -> int | None:
        return self.groups[g]["commit"] if g in self.debug_groups else None


def broker_of(path: str) -> str:
    parent = os.path.basename(os.path.dirname(path))
    if parent == "otherdays":
        parent = os.path.basename(os.path.dirname(os.path.dirname(path)))
    return parent


def iter_lines(paths: list[str]):
    """(broker, line) for every line of every file."""
    for root in paths:
        files = (
            [root]
            if os.path.isfile(root)
            else sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
        )
        for p in files:
            if os.path.basename(p).startswith((".", "_")):  # hidden files, as Hadoop skips them
                continue
            opener = gzip.open if p.endswith(".gz") else open
            with opener(p, "rt", encoding="utf-8", errors="replace", newline="\n") as f:
                for line in f:
                    yield broker_of(p), line.rstrip("\n")


def _header_fields(line: str) -> dict[str, str] | None:
    body = line.split(HEADER, 1)[1]
    if "}" not in body:
        return None
    out = {}
    for part in body.split("}", 1)[0].split(", "):
        if "=" not in part:
            return None
        k, v = part.split("=", 1)
        out[k] = v.strip("'")
    need = ("producerGroup", "commitOrRollback", "fromTransactionCheck", "msgId", "transactionId")
    return out if all(k in out for k in need) else None


def scan(paths: list[str]) -> Ref:
    ref = Ref()
    answers: dict[tuple[str, str, str], int] = defaultdict(int)  # (broker, group, msg)
    owner: dict[tuple[str, str], str] = {}  # (broker, msg) -> group
    sent: dict[tuple[str, str], int] = defaultdict(int)  # (broker, uniqKey) -> check-backs sent
    for broker, line in iter_lines(paths):
        ref.total_lines += 1
        words = line.split(" ")
        if HEADER in line:
            f = _header_fields(line)
            if f is None or not f["producerGroup"] or not f["msgId"]:
                ref.bad += 1
                continue
            g, msg, state = f["producerGroup"], f["msgId"], f["commitOrRollback"]
            ref.formats[broker].add("4.9" if "producerGroup='" in line else "5")
            java_check = f["fromTransactionCheck"] == "true"
            level = words[2] if len(words) > 2 else ""
            # only librocketmq sends an empty remark, and only its check answers come with a
            # false fromTransactionCheck and a filled transactionId; a Java client or a 5.x proxy
            # (remark null or text) fills the transactionId at the first phase too.  DEBUG lines
            # have no remark.
            cpp_like = level == "DEBUG" or line.endswith("Remark: ")
            is_check = java_check or (cpp_like and f["transactionId"] not in ("", "null"))
            c = ref.groups[g]
            cb = ref.by_broker[(g, broker)]
            if level == "DEBUG":
                ref.debug_groups.add(g)
                if state == "8" and not java_check:
                    name = "check_commit" if is_check else "commit"
                    c[name] += 1
                    cb[name] += 1
                    if is_check:
                        c["checks"] += 1
                        cb["checks"] += 1
                        answers[(broker, g, msg)] += 1
                        owner.setdefault((broker, msg), g)
                continue
            addr = line.split("producer[", 1)[1].split("]", 1)[0]
            name = {"0": "unknown", "12": "rollback", "8": "commit"}[state]
            if is_check:
                name = "check_" + name
                c["checks"] += 1
                cb["checks"] += 1
                answers[(broker, g, msg)] += 1
            c[name] += 1
            cb[name] += 1
            ref.by_addr[(g, addr)][name] += 1
            if state == "0":
                ref.unknown_ids[g].add(msg)
            if state == "0" or is_check:
                owner.setdefault((broker, msg), g)
        elif "has been checked too many times" in line and "PGROUP=" in line:
            g = line.split("PGROUP=", 1)[1].split(",", 1)[0].split("}", 1)[0]
            ref.groups[g]["discarded"] += 1
            ref.by_broker[(g, broker)]["discarded"] += 1
            uniq = line.split("UNIQ_KEY=", 1)[1].split(",", 1)[0].split("}", 1)[0]
            owner.setdefault((broker, uniq), g)
        elif "channel is null. groupId=" in line:
            g = line.rsplit("groupId=", 1)[1].strip()
            ref.groups[g]["no_channel_txlog"] += 1
            ref.by_broker[(g, broker)]["no_channel_txlog"] += 1
        elif "channel table is empty. groupId=" in line:
            g = line.rsplit("groupId=", 1)[1].strip()
            ref.groups[g]["no_channel_brokerlog"] += 1
            ref.by_broker[(g, broker)]["no_channel_brokerlog"] += 1
        elif "invoke producer exception. group=" in line:
            g = line.split("exception. group=", 1)[1].split(",", 1)[0]
            ref.groups[g]["check_send_failed"] += 1
            ref.by_broker[(g, broker)]["check_send_failed"] += 1
        elif "Check transaction. real_topic=" in line:
            sent[(broker, line.split("uniqKey=", 1)[1].split(",", 1)[0])] += 1
            ref.formats[broker].add("5")
    for (broker, msg), n in sent.items():
        g = owner.get((broker, msg))
        if g is None:
            ref.sent_unattributed += n
            continue
        ref.groups[g]["checks_sent"] += n
        ref.by_broker[(g, broker)]["checks_sent"] += n
    # check-backs of one transaction: the answers seen, or the 5.x check-sent lines if more
    for (broker, g, msg), n in answers.items():
        ref.checks_by_tx[(g, msg)] += max(n, sent.get((broker, msg), 0))
    for (broker, msg), n in sent.items():
        g = owner.get((broker, msg))
        if g is not None and (broker, g, msg) not in answers:
            ref.checks_by_tx[(g, msg)] += n
    return ref
