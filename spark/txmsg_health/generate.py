"""Realistic synthetic RocketMQ broker logs with known answers, for tests and the benchmark.

Why synthetic and why this realistic: a test that flags "exactly the planted groups" is only worth
something if the healthy groups look like real traffic and the noise looks like a real broker's.
So the generator simulates transactions, not lines: each one is COMMIT / ROLLBACK / UNKNOW at
send, UNKNOW ones are checked back on a schedule and answered, stuck ones are discarded after the
maximum checks, and every event is written in the line format the real broker uses for it
(4.9.x quoted headers with ``bname``, 5.x unquoted; Java clients' ``fromTransactionCheck=true``
vs the C++ client's filled ``transactionId``; COMMIT only at DEBUG). Around them: ~50 % noise
(the check service's scan lines, broker.log chatter, stack traces), decoys that mention
``producerGroup=``/``PGROUP=`` but are not transaction events, no-channel failures, a few
truncated and binary lines, and optional ``.gz`` rotation. 5.x brokers also write their INFO
per-check line (``Check transaction. real_topic=...,uniqKey=...``) before each check-back; a
``no_producer`` group's check-backs find no producer connected ("channel is null" in
transaction.log, "channel table is empty" in broker.log) or fail to send ("invoke producer
exception"). With ``replicas`` > 1 every broker exists that many times (``-a``, ``-b``, ...), a
group's transactions are spread over them, and a planted group misbehaves on ``-a`` only.

    python -m txmsg_health.generate OUT --lines 200000 [--layout brokers|single]
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import os
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

PROFILES = ("heavy_share", "heavy_rate", "discard", "checks", "no_producer")


@dataclass
class Group:
    name: str
    client: str  # "java" | "cpp"
    fmt: str  # "4.9" | "5"
    debug: bool
    unknown_p: float
    rollback_p: float
    profile: str  # "healthy" or one of PROFILES
    addrs: list[str]

    @property
    def broker(self) -> str:
        return f"broker-{self.fmt.replace('.', '')}-{'debug' if self.debug else 'info'}"

    def broker_of(self, replica: int, replicas: int) -> str:
        return self.broker if replicas <= 1 else f"{self.broker}-{chr(ord('a') + replica)}"


@dataclass
class Manifest:
    lines: int
    planted: list[str]
    groups: list[str]
    legacy_groups: list[str]
    files: list[str] = field(default_factory=list)
    seed: int = 0
    check_max: int = 5
    never_arrives: list[str] = field(default_factory=list)  # no_producer + legacy groups
    replicas: int = 1
    brokers: dict[str, list[str]] = field(default_factory=dict)  # group -> brokers it wrote to
    flagged_brokers: dict[str, list[str]] = field(default_factory=dict)  # planted -> where

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=1)


_WORDS = (
    "order",
    "pay",
    "stock",
    "ship",
    "refund",
    "coupon",
    "user",
    "ledger",
    "audit",
    "cart",
    "mail",
    "points",
    "bill",
    "risk",
    "price",
    "search",
    "cache",
    "report",
    "tax",
    "fx",
)


def make_groups(n: int, planted: int, rng: random.Random) -> list[Group]:
    """``n`` producer groups, ``planted`` of them UNKNOW-heavy with the profiles cycled."""
    names: set[str] = set()
    groups: list[Group] = []
    planted_idx = set(rng.sample(range(n), planted))
    k = 0
    for i in range(n):
        while True:
            name = f"pg_{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{rng.randrange(1000):03d}_tx"
            if name not in names:
                names.add(name)
                break
        profile = "healthy"
        if i in planted_idx:
            profile = PROFILES[k % len(PROFILES)]
            k += 1
        fmt = rng.choice(("4.9", "5"))
        debug = rng.random() < 0.5
        if profile == "heavy_share":
            debug = True
        elif profile == "heavy_rate":
            debug = False
        addrs = [
            f"10.{rng.randrange(1, 250)}.{rng.randrange(256)}.{rng.randrange(1, 255)}:"
            f"{rng.randrange(30000, 65000)}"
            for _ in range(rng.choice((1, 1, 2, 3)))
        ]
        groups.append(
            Group(
                name=name,
                client=rng.choice(("java", "cpp")),
                fmt=fmt,
                debug=debug,
                unknown_p=0.40 if profile != "healthy" else 0.01,
                rollback_p=0.03,
                profile=profile,
                addrs=addrs,
            )
        )
    return groups


class _Sim:
    """The broker simulation: a clock, pending check-backs, and line formatting."""

    def __init__(
        self,
        groups: list[Group],
        rng: random.Random,
        lines_per_minute: int,
        check_max: int,
        check_interval_s: float,
        timeout_s: float,
        bad_every: int,
        replicas: int = 1,
    ) -> None:
        self.g = groups
        self.rng = rng
        self.dt = 60.0 / lines_per_minute
        self.t = 0.0
        self.start = datetime(2026, 11, 22, 10, 0, 0)  # broker-local (UTC+8) time
        self.check_max = check_max
        self.interval = check_interval_s
        self.timeout = timeout_s
        self.bad_every = bad_every
        self.replicas = replicas
        self.pending: list[tuple[float, int, int, str, str, int, str, int]] = []
        self.seen: dict[str, set[str]] = {}
        self.seq = 0
        self.offset = 1000
        self.clo = 5_000_000
        self._stamp_sec = -1
        self._stamp = ""
        self.legacy = [f"pg_legacy_{w}_tx" for w in ("billing", "crm")]

    # -- formatting -------------------------------------------------------------------------
    def stamp(self) -> str:
        s = int(self.t)
        if s != self._stamp_sec:
            self._stamp_sec = s
            self._stamp = (self.start + timedelta(seconds=s)).strftime("%Y-%m-%d %H:%M:%S")
        return self._stamp

    def header(self, g: Group, state: int, ftc: bool, msg: str, tid: str) -> str:
        self.offset += 1
        self.clo += self.rng.randrange(280, 420)
        f = "true" if ftc else "false"
        if g.fmt == "4.9":
            return (
                f"EndTransactionRequestHeader{{producerGroup='{g.name}', tranStateTableOffset={self.offset}, "
                f"commitLogOffset={self.clo}, commitOrRollback={state}, fromTransactionCheck={f}, "
                f"msgId='{msg}', transactionId='{tid}', bname='broker-a'}}"
            )
        return (
            f"EndTransactionRequestHeader{{producerGroup={g.name}, tranStateTableOffset={self.offset}, "
            f"commitLogOffset={self.clo}, commitOrRollback={state}, fromTransactionCheck={f}, "
            f"msgId={msg}, transactionId={tid}}}"
        )

    def answer(self, g: Group, addr: str, state: int, msg: str, check: bool) -> list[str]:
        """The lines one end-transaction request produces."""
        java = g.client == "java"
        ftc = check and java
        tid = msg if check else ("null" if java else "")
        hdr = self.header(g, state, ftc, msg, tid)
        ts = self.stamp()
        thread = f"EndTransactionThread_{self.rng.randrange(1, 13)}"
        out = []
        if g.debug:
            out.append(f"{ts} DEBUG {thread} - Transaction request:{hdr}")
        remark = "null" if java else ""
        if ftc:
            what = {
                0: "but it's pending status",
                8: "the producer commit the message",
                12: "the producer rollback the message",
            }[state]
            out.append(
                f"{ts} WARN {thread} - Check producer[{addr}] transaction state, {what}."
                f"RequestHeader: {hdr} Remark: {remark}"
            )
        elif state == 0:
            out.append(
                f"{ts} WARN {thread} - The producer[{addr}] end transaction in sending message,  "
                f"and it's pending status.RequestHeader: {hdr} Remark: {remark}"
            )
        elif state == 12:
            out.append(
                f"{ts} WARN {thread} - The producer[{addr}] end transaction in sending message, "
                f"rollback the message.RequestHeader: {hdr} Remark: {remark}"
            )
        return out

    def discard(self, g: Group, addr: str, msg: str, times: int) -> list[str]:
        ts = self.stamp()
        self.clo += 400
        return [
            f"{ts} ERROR TransactionalMessageCheckService - MsgExt:MessageExt [brokerName=null, queueId=0, "
            f"storeSize=318, queueOffset={self.offset}, sysFlag=0, bornTimestamp=1795342324039, "
            f"bornHost=/{addr}, storeTimestamp=1795342335627, storeHost=/10.0.0.11:10911, "
            f"msgId=0A00000B00002A9F{self.clo:016X}, commitLogOffset={self.clo}, bodyCRC=1333459071, "
            f"reconsumeTimes=0, preparedTransactionOffset=0, toString()=Message{{topic='RMQ_SYS_TRANS_HALF_TOPIC', "
            f"flag=0, properties={{REAL_TOPIC=t_{g.name}, TRANSACTION_CHECK_TIMES={times}, KEYS=K{self.offset}, "
            f"TRAN_MSG=true, UNIQ_KEY={msg}, CLUSTER=DefaultCluster, PGROUP={g.name}, WAIT=true, TAGS=TagA, "
            f"REAL_QID=0}}, body=[123, 125], transactionId='null'}}] has been checked too many times, so "
            f"discard it by moving it to system topic TRANS_CHECK_MAXTIME_TOPIC",
            f"{ts} INFO TransactionalMessageCheckService - Put checked-too-many-time half message to "
            f"TRANS_CHECK_MAXTIME_TOPIC OK. Restored in queueOffset={self.offset}, commitLogOffset={self.clo}, "
            f"real topic=t_{g.name}",
        ]

    def check_sent(self, g: Group, msg: str) -> str:
        """5.1+: INFO, one per check-back, before it is sent (no group on the line)."""
        return (
            f"{self.stamp()} INFO TransactionalMessageCheckService - Check transaction. "
            f"real_topic=t_{g.name},uniqKey={msg},offset={self.offset},commitLogOffset={self.clo}"
        )

    def undelivered(self, g: Group) -> list[tuple[str, str]]:
        """A check-back that never reaches the producer: no channel (both files), or send failed."""
        ts = self.stamp()
        thread = "Transaction-msg-check-thread" + ("1" if g.fmt == "5" else "")
        if self.rng.random() < 0.8:
            return [
                (
                    "broker",
                    f"{ts} WARN {thread} - Check transaction failed, channel table is empty. "
                    f"groupId={g.name}",
                ),
                (
                    "tx",
                    f"{ts} WARN {thread} - Check transaction failed, channel is null. groupId={g.name}",
                ),
            ]
        return [
            (
                "broker",
                f"{ts} ERROR {thread} - Check transaction failed because invoke producer "
                f"exception. group={g.name}, msgId=0A00000B00002A9F{self.clo:016X}, "
                f"error=org.apache.rocketmq.remoting.exception.RemotingTimeoutException: "
                f"invokeOnewayImpl tryAcquire semaphore timeout, 10ms, waiting thread nums: 0 "
                f"semaphoreOnewayValue: 0",
            )
        ]

    def noise(self) -> tuple[str, list[str]]:
        """One noise event: ("tx"|"broker", lines). Mostly one line; stack traces are several."""
        ts = self.stamp()
        r = self.rng.random()
        o = self.offset
        if r < 0.30:
            return "tx", [
                self.rng.choice(
                    (
                        f"{ts} INFO TransactionalMessageCheckService - Begin to check prepare message, begin time:{1795342324039 + o}",
                        f"{ts} INFO TransactionalMessageCheckService - End to check prepare message, consumed time:{o % 97}",
                        f"{ts} INFO TransactionalMessageCheckService - Before check, the queue=MessageQueue [topic=RMQ_SYS_TRANS_HALF_TOPIC, brokerName=broker-a, queueId=0] msgOffset={o} opOffset={o - 7}",
                        f"{ts} WARN TransactionalMessageCheckService - No new message. GetMessageStatus=OFFSET_OVERFLOW_ONE, topic=RMQ_SYS_TRANS_OP_HALF_TOPIC, groupId=CID_RMQ_SYS_TRANS, requestOffset={o}",
                        f"{ts} WARN TransactionalMessageCheckService - The miss op offset={o} in queue=MessageQueue [topic=RMQ_SYS_TRANS_OP_HALF_TOPIC, brokerName=broker-a, queueId=0] is NO_NEW_MSG, pullResult=PullResult [pullStatus=NO_NEW_MSG, nextBeginOffset={o}, minOffset=0, maxOffset={o}, msgFoundList=0]",
                    )
                )
            ]
        if r < 0.62:
            return "broker", [
                self.rng.choice(
                    (
                        f"{ts} INFO brokerOutApi_thread_{o % 4 + 1} - register broker[0]to name server 127.0.0.1:9876 OK",
                        f"{ts} INFO BrokerControllerScheduledThread1 - dispatch behind commit log {o % 5000} bytes",
                        f"{ts} INFO SendMessageThread_{o % 8 + 1} - Create new topic by default topic:[TBW102] config:[TopicConfig [topicName=t_{o % 50}, readQueueNums=4, writeQueueNums=4, perm=RW-]]",
                        f"{ts} ERROR NettyServerNIOSelector_3_{o % 4 + 1} - RemotingCommand [code=11, language=CPP, version=333, opaque={o}, flag(B)=0, remark=, extFields={{queueId=0, maxMsgNums=32, sysFlag=2, commitOffset=0, subscription=*}}, serializeTypeCurrentRPC=JSON]",
                    )
                )
            ]
        g = self.g[self.rng.randrange(len(self.g))]
        if r < 0.70:  # decoys: mention the group, are not transaction events
            return "broker", [
                self.rng.choice(
                    (
                        f"{ts} INFO HeartbeatThread_{o % 4 + 1} - new producer connected, group: {g.name} channel: ClientChannelInfo [channel=[id: 0x5d86ddd8, L:/10.0.0.11:10911 - R:/{g.addrs[0]}], clientId={g.addrs[0].split(':')[0]}@{o % 9999}#DEFAULT, language={'JAVA' if g.client == 'java' else 'CPP'}, version=333, lastUpdateTimestamp=1795342808133]",
                        f"{ts} WARN AdminBrokerThread_{o % 4 + 1} - RemotingCommand [code=37, language=JAVA, version=401, opaque={o}, flag(B)=0, remark=null, extFields={{producerGroup={g.name}, tranStateTableOffset={o}, commitOrRollback=0, fromTransactionCheck=false, msgId=7F000001{o:024X}}}] request dropped: broker busy",
                        f"{ts} INFO ClientManageThread_{o % 4 + 1} - unregister a producer group[{g.name}] from groupChannelTable",
                        f"{ts} INFO AdminBrokerThread_{o % 4 + 1} - query producer connection, producerGroup={g.name}, connections=1",
                    )
                )
            ]
        if r < 0.76:
            return "tx", [
                f"{ts} DEBUG EndTransactionThread_{o % 12 + 1} - Transaction op message write successfully. messageId=7F00000100002A9F{o:016X}, queueId=0 msgExt:MessageExt [brokerName=null, queueId=0, storeSize=292, queueOffset={o}, sysFlag=0, bornTimestamp=1795342808187, bornHost=/{g.addrs[0]}, msgId=7F00000100002A9F{o:016X}, toString()=Message{{topic='RMQ_SYS_TRANS_HALF_TOPIC', flag=0, properties={{UNIQ_KEY=7F000001{o:024X}, CLUSTER=DefaultCluster, PGROUP={g.name}, WAIT=true}}, body=[98], transactionId='null'}}]"
            ]
        if r < 0.80:  # multi-line stack trace
            return "broker", [
                f"{ts} ERROR NettyServerNIOSelector_3_1 - processRequestWrapper response to /{g.addrs[0]} failed",
                "java.nio.channels.ClosedChannelException: null",
                "\tat io.netty.channel.AbstractChannel$AbstractUnsafe.newClosedChannelException(AbstractChannel.java:957)",
                "\tat io.netty.channel.AbstractChannel$AbstractUnsafe.write(AbstractChannel.java:865)",
                "\tat java.base/java.lang.Thread.run(Thread.java:833)",
            ]
        if r < 0.83:
            lg = self.legacy[o % len(self.legacy)]
            return "tx", [
                f"{ts} WARN Transaction-msg-check-thread - Check transaction failed, channel is null. groupId={lg}"
            ]
        if r < 0.84:
            lg = self.legacy[o % len(self.legacy)]
            return "broker", [
                f"{ts} WARN Transaction-msg-check-thread - Check transaction failed, channel table is empty. groupId={lg}"
            ]
        return "tx", [
            f"{ts} INFO TransactionalMessageCheckService - Check topic=RMQ_SYS_TRANS_HALF_TOPIC, queues=[MessageQueue [topic=RMQ_SYS_TRANS_HALF_TOPIC, brokerName=broker-a, queueId=0]]"
        ]

    # -- the event loop ---------------------------------------------------------------------
    def events(self, target: int) -> Iterator[tuple[str, str, str]]:
        """Yield (broker, "tx"|"broker", line) until ``target`` lines; ~half of them noise."""
        rng = self.rng
        groups = self.g
        index = {g.name: i for i, g in enumerate(groups)}
        picks: list[Group] = []
        emitted = noise = txl = 0
        n_msg = 0
        while emitted < target:
            self.t += self.dt
            if noise <= txl:
                kind, lines = self.noise()
                broker = groups[rng.randrange(len(groups))].broker_of(
                    rng.randrange(self.replicas), self.replicas
                )
                if (
                    self.bad_every
                    and (emitted + len(lines)) // self.bad_every != emitted // self.bad_every
                ):
                    lines = [*lines, self._bad(rng)]
                    kind = "tx"
                for ln in lines:
                    yield broker, kind, ln
                noise += len(lines)
                emitted += len(lines)
                continue
            if self.pending and self.pending[0][0] <= self.t:
                _, _, gi, addr, msg, checks, plan, rep = heapq.heappop(self.pending)
                g = groups[gi]
                routed = self._check(g, gi, addr, msg, checks, plan, rep)
            else:
                if not picks:
                    picks = rng.choices(groups, k=4096)
                g = picks.pop()
                gi = index[g.name]
                n_msg += 1
                addr = g.addrs[n_msg % len(g.addrs)]
                msg = f"{_addr_hex(addr)}{gi:04X}{n_msg:012X}"
                rep = n_msg % self.replicas
                # with replicas, a planted group misbehaves on its first broker only
                planted_here = rep == 0
                unknown_p = g.unknown_p if planted_here else min(g.unknown_p, 0.01)
                r = rng.random()
                if r < unknown_p:
                    lines = self.answer(g, addr, 0, msg, False)
                    self.seq += 1
                    plan = self._plan(g) if planted_here else self._plan_healthy()
                    heapq.heappush(
                        self.pending, (self.t + self.timeout, self.seq, gi, addr, msg, 0, plan, rep)
                    )
                elif r < unknown_p + g.rollback_p:
                    lines = self.answer(g, addr, 12, msg, False)
                else:
                    lines = self.answer(g, addr, 8, msg, False)
                routed = [("tx", ln) for ln in lines]
            broker = g.broker_of(rep, self.replicas)
            self.seen.setdefault(g.name, set()).add(broker)
            for kind, ln in routed:
                yield broker, kind, ln
            txl += len(routed)
            emitted += len(routed)

    def _plan(self, g: Group) -> str:
        """How the producer will answer this UNKNOW transaction's checks."""
        rng = self.rng
        if g.profile == "discard":
            return "stuck" if rng.random() < 0.5 else "commit1"
        if g.profile == "checks":
            return "unknown4"
        if g.profile == "no_producer":
            return "nochannel"
        return self._plan_healthy()

    def _plan_healthy(self) -> str:
        r = self.rng.random()
        if r < 0.05:
            return "unknown1"
        return "rollback1" if r < 0.20 else "commit1"

    def _check(
        self, g: Group, gi: int, addr: str, msg: str, checks: int, plan: str, rep: int
    ) -> list[tuple[str, str]]:
        if plan in ("stuck", "nochannel") and checks >= self.check_max:
            return [("tx", ln) for ln in self.discard(g, addr, msg, checks)]
        checks += 1
        sent = [("tx", self.check_sent(g, msg))] if g.fmt == "5" else []
        if plan == "nochannel":
            self.seq += 1
            heapq.heappush(
                self.pending, (self.t + self.interval, self.seq, gi, addr, msg, checks, plan, rep)
            )
            return sent + self.undelivered(g)
        if (
            plan == "stuck"
            or (plan == "unknown1" and checks == 1)
            or (plan == "unknown4" and checks <= 4)
        ):
            state = 0
        elif plan == "rollback1":
            state = 12
        else:
            state = 8
        lines = self.answer(g, addr, state, msg, True)
        if state == 0:
            self.seq += 1
            heapq.heappush(
                self.pending, (self.t + self.interval, self.seq, gi, addr, msg, checks, plan, rep)
            )
        return sent + [("tx", ln) for ln in lines]

    def _bad(self, rng: random.Random) -> str:
        """A truncated transaction line (cut before transactionId) or a binary/foreign line."""
        g = self.g[rng.randrange(len(self.g))]
        if rng.random() < 0.6:
            full = self.answer(g, g.addrs[0], 0, f"DEADBEEF{self.offset:024X}", False)[-1]
            return full[: full.index("transactionId=") - rng.randrange(2, 40)]
        return "\x00\x17PK\x03\x04 garbage \ufffd\ufffd foreign line without a timestamp"


def _addr_hex(addr: str) -> str:
    ip = addr.split(":", maxsplit=1)[0].split(".")
    return "".join(f"{int(x):02X}" for x in ip) + "0000"


def generate(
    out: str,
    lines: int = 200_000,
    *,
    groups: int = 200,
    planted: int = 6,
    seed: int = 7,
    layout: str = "brokers",
    gz: bool = True,
    lines_per_minute: int = 28_000,
    check_max: int = 5,
    check_interval_s: float = 10.0,
    timeout_s: float = 6.0,
    bad_every: int = 20_000,
    replicas: int = 1,
) -> Manifest:
    """Write logs under ``out`` (a directory per broker, or one file ``out`` when single).

    ``layout="brokers"``: ``out/<broker>/transaction.log``, ``broker.log`` and, with ``gz``, the
    oldest ~30 % of transaction lines in ``otherdays/transaction.1.log.gz`` (the broker's rotation).
    ``layout="single"``: every line into the one file ``out`` (what the benchmark reads).
    """
    rng = random.Random(seed)  # noqa: S311 - seeded on purpose: the same logs for the same seed
    gs = make_groups(groups, planted, rng)
    sim = _Sim(
        gs,
        rng,
        lines_per_minute,
        check_max,
        check_interval_s,
        timeout_s,
        bad_every,
        replicas=max(1, replicas),
    )
    man = Manifest(
        lines=0,
        planted=sorted(g.name for g in gs if g.profile != "healthy"),
        groups=sorted(g.name for g in gs),
        legacy_groups=sim.legacy,
        seed=seed,
        check_max=check_max,
        replicas=max(1, replicas),
        never_arrives=sorted([*(g.name for g in gs if g.profile == "no_producer"), *sim.legacy]),
        flagged_brokers={
            g.name: [g.broker_of(0, max(1, replicas))] for g in gs if g.profile != "healthy"
        },
    )
    if layout == "single":
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        n = 0
        with open(out, "w", encoding="utf-8", errors="surrogateescape", buffering=1 << 20) as f:
            buf: list[str] = []
            for _, _, ln in _route(sim, lines):
                buf.append(ln)
                if len(buf) >= 8192:
                    f.write("\n".join(buf) + "\n")
                    n += len(buf)
                    buf.clear()
            if buf:
                f.write("\n".join(buf) + "\n")
                n += len(buf)
        man.lines, man.files = n, [out]
        man.brokers = {k: sorted(v) for k, v in sorted(sim.seen.items())}
        return man
    per: dict[tuple[str, str], list[str]] = {}
    for broker, kind, ln in _route(sim, lines):
        per.setdefault((broker, kind), []).append(ln)
    for (broker, kind), lns in sorted(per.items()):
        d = os.path.join(out, broker)
        os.makedirs(d, exist_ok=True)
        name = "transaction.log" if kind == "tx" else "broker.log"
        cut = int(len(lns) * 0.3) if (gz and kind == "tx") else 0
        if cut:
            os.makedirs(os.path.join(d, "otherdays"), exist_ok=True)
            gzp = os.path.join(d, "otherdays", "transaction.1.log.gz")
            with gzip.open(gzp, "wt", encoding="utf-8") as f:
                f.write("\n".join(lns[:cut]) + "\n")
            man.files.append(gzp)
        p = os.path.join(d, name)
        with open(p, "w", encoding="utf-8") as f:
            f.write("\n".join(lns[cut:]) + "\n")
        man.files.append(p)
        man.lines += len(lns)
    man.brokers = {k: sorted(v) for k, v in sorted(sim.seen.items())}
    man.save(os.path.join(out, ".manifest.json"))  # hidden: Spark skips it
    return man


def _route(sim: _Sim, lines: int) -> Iterator[tuple[str, str, str]]:
    return sim.events(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="txmsg_health.generate", description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--groups", type=int, default=200)
    p.add_argument("--planted", type=int, default=6)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--layout", choices=("brokers", "single"), default="brokers")
    p.add_argument("--no-gz", action="store_true")
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="brokers per kind (-a, -b, ...); planted groups misbehave on -a only",
    )
    a = p.parse_args(argv)
    m = generate(
        a.out,
        a.lines,
        groups=a.groups,
        planted=a.planted,
        seed=a.seed,
        layout=a.layout,
        gz=not a.no_gz,
        replicas=a.replicas,
    )
    print(json.dumps({"lines": m.lines, "planted": m.planted, "files": len(m.files)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
