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
    groups: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    debug_groups: set[str] = field(default_factory=set)
    unknown_ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    checks_by_tx: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    by_addr: dict[tuple[str, str], dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int)))

    def commit(self, g: str) -> int | None:
        return self.groups[g]["commit"] if g in self.debug_groups else None


def iter_lines(paths: list[str]):
    for root in paths:
        files = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
        for p in files:
            if os.path.basename(p).startswith((".", "_")):  # hidden files, as Hadoop skips them
                continue
            opener = gzip.open if p.endswith(".gz") else open
            with opener(p, "rt", encoding="utf-8", errors="replace", newline="\n") as f:
                for line in f:
                    yield line.rstrip("\n")


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
    for line in iter_lines(paths):
        ref.total_lines += 1
        words = line.split(" ")
        if HEADER in line:
            f = _header_fields(line)
            if f is None or not f["producerGroup"] or not f["msgId"]:
                ref.bad += 1
                continue
            g, msg, state = f["producerGroup"], f["msgId"], f["commitOrRollback"]
            java_check = f["fromTransactionCheck"] == "true"
            is_check = java_check or f["transactionId"] not in ("", "null")
            level = words[2] if len(words) > 2 else ""
            c = ref.groups[g]
            if level == "DEBUG":
                ref.debug_groups.add(g)
                if state == "8" and not java_check:
                    c["check_commit" if is_check else "commit"] += 1
                    if is_check:
                        c["checks"] += 1
                        ref.checks_by_tx[(g, msg)] += 1
                continue
            addr = line.split("producer[", 1)[1].split("]", 1)[0]
            name = {"0": "unknown", "12": "rollback", "8": "commit"}[state]
            if is_check:
                name = "check_" + name
                c["checks"] += 1
                ref.checks_by_tx[(g, msg)] += 1
            c[name] += 1
            ref.by_addr[(g, addr)][name] += 1
            if state == "0":
                ref.unknown_ids[g].add(msg)
        elif "has been checked too many times" in line and "PGROUP=" in line:
            g = line.split("PGROUP=", 1)[1].split(",", 1)[0].split("}", 1)[0]
            ref.groups[g]["discarded"] += 1
        elif "channel is null. groupId=" in line:
            ref.groups[line.rsplit("groupId=", 1)[1].strip()]["no_channel_txlog"] += 1
    return ref
