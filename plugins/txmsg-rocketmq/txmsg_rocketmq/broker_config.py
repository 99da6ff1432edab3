"""Read brokers' transaction settings over remoting, for ``txmsg doctor``.

Why: since RocketMQ 5.1 a broker writes a transaction's commit/rollback "op" record in batches
(``transactionOpBatchInterval``, 3000 ms by default).  When ``transactionTimeOut`` is shorter, the check
service sees finished transactions as pending and checks them back; a COMMIT answer then stores the message
for consumers again (a duplicate), and a COMMIT answer for a rolled-back transaction delivers it.  Users
lower ``transactionTimeOut`` for faster check-backs, so the doctor reads both settings and warns.

Above the batch interval a smaller risk is left, which the doctor reports as a note: the first op batch
after a broker start is written up to two intervals after the first commit (the batch's clock starts at
that commit), and the official 5.x Python client stamps a message's birth in whole seconds, so the broker
sees its half message up to 1 s older than it is.  A real 5.3.3 with ``transactionTimeOut=2000`` and a
1500 ms batch checked back the one transaction committed after a restart in 4 of 10 restarts (none
of 6 with 400 ms; docs/rocketmq-facts.md).

How: the name server's GET_BROKER_CLUSTER_INFO (106) lists the brokers; each master answers
GET_BROKER_CONFIG (26, ``AdminBrokerProcessor.getBrokerConfig`` in 4.9.8 and 5.3.3) with a properties
text (``key=value`` lines).  A 4.9.8 broker has no ``transactionOpBatchInterval`` (it writes op records at
once).  One short TCP connection per request, the RocketMQ 4.x remoting frame with a JSON header, as
:mod:`.routes` does.
"""

from __future__ import annotations

import json
import re
import socket
import struct
from dataclasses import dataclass

from .routes import RouteQueryError, _read

GET_BROKER_CONFIG = 26
GET_BROKER_CLUSTER_INFO = 106
SUCCESS = 0
_BARE_KEY = re.compile(r"([{,])\s*(-?\d+)\s*:")


WHOLE_SECOND_BIRTHS_MS = 1000
"""How much older than it is a half message from the official 5.x Python client can look: the client
sends its born timestamp in whole seconds, and the broker ages the message from it."""


@dataclass(frozen=True)
class TransactionSettings:
    """One broker's transaction settings (ms); ``op_batch_interval`` None = a broker without batching."""

    broker: str
    addr: str
    transaction_timeout: int | None
    check_interval: int | None
    check_max: int | None
    op_batch_interval: int | None

    @property
    def checks_finished_transactions(self) -> bool:
        """``transactionTimeOut`` < ``transactionOpBatchInterval``: finished transactions get checked."""
        return (
            self.op_batch_interval is not None
            and self.transaction_timeout is not None
            and self.transaction_timeout < self.op_batch_interval
        )

    def safe_timeout(self, born_slack_ms: int = 0) -> int | None:
        """The least ``transactionTimeOut`` at which no finished transaction is checked back, not even
        in the first op batch after a start: two batch intervals, plus ``born_slack_ms`` for clients
        that stamp births early (:data:`WHOLE_SECOND_BIRTHS_MS`).  None: a broker without batches."""
        if self.op_batch_interval is None:
            return None
        return 2 * self.op_batch_interval + born_slack_ms


def call(
    addr: str, code: int, ext: dict[str, str] | None = None, *, timeout: float = 3.0
) -> tuple[int, bytes]:
    """One remoting request to ``addr``; (response code, body)."""
    host, _, port = addr.rpartition(":")
    header = json.dumps(
        {
            "code": code,
            "language": "PYTHON",
            "version": 0,
            "opaque": 1,
            "flag": 0,
            "extFields": ext or {},
        },
        separators=(",", ":"),
    ).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(frame)
        (length,) = struct.unpack(">I", _read(sock, 4))
        payload = _read(sock, length)
    (mark,) = struct.unpack(">I", payload[:4])
    header_len = mark & 0xFFFFFF
    response = json.loads(payload[4 : 4 + header_len])
    return int(response.get("code", -1)), payload[4 + header_len :]


def master_brokers(name_server: str, *, timeout: float = 3.0) -> dict[str, str]:
    """broker name -> master address, from the first name server that answers."""
    errors: list[str] = []
    for addr in [a.strip() for a in name_server.split(";") if a.strip()]:
        try:
            code, body = call(addr, GET_BROKER_CLUSTER_INFO, timeout=timeout)
        except (OSError, ValueError) as exc:
            errors.append(f"{addr}: {exc}")
            continue
        if code != SUCCESS:
            errors.append(f"{addr}: code {code}")
            continue
        data = json.loads(_BARE_KEY.sub(r'\1"\2":', body.decode("utf-8")))
        masters: dict[str, str] = {}
        for name, entry in (data.get("brokerAddrTable") or {}).items():
            master = (entry.get("brokerAddrs") or {}).get("0")
            if master:
                masters[str(name)] = str(master)
        return masters
    raise RouteQueryError(f"no name server answered GET_BROKER_CLUSTER_INFO: {'; '.join(errors)}")


def parse_properties(text: str) -> dict[str, str]:
    """``MixAll.properties2String`` output (``key=value`` lines) -> dict (first ``=`` splits)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip()
    return props


def broker_config(addr: str, *, timeout: float = 3.0) -> dict[str, str]:
    """GET_BROKER_CONFIG of the broker at ``addr``; raises OSError when it does not answer SUCCESS."""
    code, body = call(addr, GET_BROKER_CONFIG, timeout=timeout)
    if code != SUCCESS:
        raise RouteQueryError(f"{addr} answered GET_BROKER_CONFIG with code {code}")
    return parse_properties(body.decode("utf-8", "replace"))


def _int(props: dict[str, str], key: str) -> int | None:
    try:
        return int(props[key])
    except (KeyError, ValueError):
        return None


def transaction_settings(name: str, addr: str, props: dict[str, str]) -> TransactionSettings:
    return TransactionSettings(
        broker=name,
        addr=addr,
        transaction_timeout=_int(props, "transactionTimeOut"),
        check_interval=_int(props, "transactionCheckInterval"),
        check_max=_int(props, "transactionCheckMax"),
        op_batch_interval=_int(props, "transactionOpBatchInterval"),
    )


def advice(s: TransactionSettings, *, born_slack_ms: int = 0) -> str:
    """What a user must know about ``s``: the doctor's detail text (``born_slack_ms``: see
    :meth:`TransactionSettings.safe_timeout`)."""
    shown = (
        f"transactionTimeOut={s.transaction_timeout}, transactionCheckInterval={s.check_interval}, "
        f"transactionCheckMax={s.check_max}"
    )
    if s.op_batch_interval is None:
        return f"{shown}; op records written at once (no transactionOpBatchInterval: a 4.x broker)"
    shown += f", transactionOpBatchInterval={s.op_batch_interval}"
    if not s.checks_finished_transactions:
        safe = s.safe_timeout(born_slack_ms)
        if safe is None or s.transaction_timeout is None or s.transaction_timeout >= safe:
            return f"{shown}; op batches are written within the transaction timeout"
        births = (
            ", and the 5.x client stamps births in whole seconds (its messages look up to 1 s older)"
            if born_slack_ms
            else ""
        )
        return (
            f"{shown}; note: the first op batch after a broker start is written up to two intervals "
            f"after the first commit{births}, so a transaction committed just after a broker start "
            "can still be checked back (a real 5.3.3 at 2000/1500 did in 4 of 10 restarts). Rare; "
            "check_local must answer ROLLBACK for rolled-back transactions (RecordBackedListener "
            f"does). To rule it out set transactionTimeOut to at least {safe}"
        )
    return (
        f"{shown}: transactionTimeOut < transactionOpBatchInterval, so this 5.x broker checks back "
        "transactions that already committed or rolled back (their op record is still in the batch). "
        "A COMMIT answer stores the message again (duplicate deliveries), a COMMIT answer for a "
        "rolled-back transaction delivers it, and re-checked transactions are discarded after "
        "transactionCheckMax checks although they were answered. Set transactionTimeOut above "
        f"transactionOpBatchInterval with a margin (e.g. transactionTimeOut={max(6000, 2 * s.op_batch_interval)}, "
        "the 5.x default is 6000 with a 3000 ms batch) or lower transactionOpBatchInterval in broker.conf; "
        "and let check_local answer ROLLBACK for rolled-back transactions (RecordBackedListener does)"
    )
