"""``txmsg doctor`` checks of the ``rocketmq5`` backend (entry point ``txmsg.doctor_checks: rocketmq5``).

Each check is ``(label, detail, ok)``: the 5.x client is installed and its ``rocketmq`` package is
the one that imports (``rocketmq-client-python`` 2.0.0 installs a ``rocketmq/__init__.py`` of its
own; with that one on top the 5.x client cannot import itself), and every configured endpoint
answers gRPC.  librocketmq and ``rocketmq-client-python`` are not needed and not checked, except
for the rescue of discarded half messages: a row says whether it runs (a ``name_server`` and the
``rocketmq`` backend's client), since a 5.x proxy serves the discard topic to no gRPC client.
Imports run in a child interpreter so a broken combination leaves nothing half-imported here.

The broker's transaction settings cannot be read over gRPC (the proxy's ``MessagingService`` has no call
for them).  When the remoting backend (``txmsg-rocketmq``) is installed too and a name server answers at
the configured ``name_server``, its GET_BROKER_CONFIG reader reports every master's settings; otherwise
one advisory row says what to check by hand: a 5.1+ broker whose ``transactionTimeOut`` is below its
``transactionOpBatchInterval`` checks back transactions that already ended.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
from typing import Any

from .remoting import SystemTopicRoute
from .settings import RocketMQ5Settings

Check = tuple[str, str, bool]

CLIENT5 = "rocketmq-python-client"
PROBE = "import rocketmq.v5.producer, rocketmq.grpc_protocol; from rocketmq import Producer"


def _fix(version: str) -> str:
    return (
        f"run `pip install --no-deps --force-reinstall {CLIENT5}=={version}` so the 5.x "
        "rocketmq/__init__.py wins (`pip install 'txmsg[rocketmq5]'` in a fresh environment)"
    )


def _child_import() -> str | None:
    proc = subprocess.run(  # noqa: S603 - fixed argv: this interpreter and a constant probe
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60
    )
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def _endpoint(address: str, tls: bool) -> Check:
    label = f"endpoint {address} answers gRPC"
    try:
        import grpc  # noqa: PLC0415 - only with the client installed

        channel = (
            grpc.secure_channel(address, grpc.ssl_channel_credentials())
            if tls
            else grpc.insecure_channel(address)
        )
        try:
            grpc.channel_ready_future(channel).result(timeout=3.0)
        finally:
            channel.close()
    except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not crash
        detail = str(exc) or type(exc).__name__
        return (
            label,
            f"{detail}; start the proxy (or `txmsg broker --grpc-port`) or fix "
            "`endpoints` / TXMSG_ENDPOINTS",
            False,
        )
    return (label, "ready" + (" (TLS)" if tls else ""), True)


def report(config: Any = None) -> list[Check]:
    try:
        version = importlib.metadata.version(CLIENT5)
    except importlib.metadata.PackageNotFoundError:
        return [
            (
                f"{CLIENT5} (rocketmq5 backend)",
                "not installed: `pip install 'txmsg[rocketmq5]'`",
                False,
            )
        ]
    checks: list[Check] = [(f"{CLIENT5} (rocketmq5 backend)", version, True)]
    error = _child_import()
    checks.append(
        (
            "RocketMQ 5 client imports",
            "ok" if error is None else f"{error}; {_fix(version)}",
            error is None,
        )
    )
    if error is not None:
        return checks
    settings = RocketMQ5Settings.of(config)
    endpoints, tls = settings.endpoints, settings.tls
    addresses = [a.strip() for a in endpoints.split(";") if a.strip()]
    checks.extend(_endpoint(address, tls) for address in addresses)
    checks.extend(_broker_settings(config))
    checks.append(rescue_row(settings.name_server))
    return checks


def rescue_row(name_server: str | None) -> Check:
    """Whether half messages the broker discards after its last check-back are rescued
    (:mod:`txmsg.rescue`): only through a name server, as the proxy refuses the discard topic
    over gRPC (:mod:`.remoting`).  Advisory: the app runs without the rescue."""
    label = "discarded half messages rescued"
    problem = SystemTopicRoute(None, name_server).problem()
    if problem is None:
        return (label, f"yes: TRANS_CHECK_MAX_TIME_TOPIC read via name server {name_server}", True)
    return (label, f"NO: {problem}", False)


def _broker_settings(config: Any) -> list[Check]:
    """Read the brokers' transaction settings through a name server when the remoting reader is
    installed (``txmsg_rocketmq.doctor``); else the advisory row."""
    name_server = getattr(config, "name_server", None)
    if not name_server or importlib.util.find_spec("txmsg_rocketmq") is None:
        return [BROKER_SETTINGS_ADVICE]
    try:
        remoting = importlib.import_module("txmsg_rocketmq.doctor")
        whole_seconds = remoting.broker_config.WHOLE_SECOND_BIRTHS_MS  # this client's births
        rows: list[Check] = list(
            remoting.broker_transaction_settings(str(name_server), born_slack_ms=whole_seconds)
        )
    except Exception:  # noqa: BLE001 - the doctor reports, it does not crash
        return [BROKER_SETTINGS_ADVICE]
    if any("cannot list the brokers" in detail for _label, detail, _ok in rows):
        return [BROKER_SETTINGS_ADVICE]  # no name server there: say what to check by hand
    return [(f"{label} (via name server {name_server})", d, ok) for label, d, ok in rows]


#: advisory (ok): what ``txmsg doctor`` cannot read over gRPC and a user must check on the broker
BROKER_SETTINGS_ADVICE: Check = (
    "broker transaction settings",
    "not readable over gRPC; check by hand (`mqadmin getBrokerConfig -b <broker>:10911`, or broker.conf) "
    "that transactionTimeOut (default 6000) is above transactionOpBatchInterval (RocketMQ 5.1+, default "
    "3000) with a margin. If it is below, the broker checks back transactions that already committed or "
    "rolled back: a COMMIT answer delivers the message again, or delivers a rolled-back one, so "
    "check_local must answer ROLLBACK for rolled-back transactions (RecordBackedListener does). "
    "Below 2 x transactionOpBatchInterval + 1 s it still may, rarely, just after a broker start (the "
    "first batch waits up to two intervals; this client stamps births in whole seconds). "
    "With the rocketmq backend (remoting) `txmsg doctor` reads these settings itself",
    True,
)
