"""``txmsg broker`` (run name server + broker in the foreground), ``txmsg topic create`` and
``txmsg group create``."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from . import fastjson
from .app import ready_line
from .broker import Broker
from .childproc import exit_with_parent
from .cluster import BrokerCluster
from .codec import GET_BROKER_CLUSTER_INFO, SUCCESS, UPDATE_AND_CREATE_TOPIC
from .config import BrokerConfig
from .nameserver import NameServer
from .ports import PortInUse
from .rawclient import call

#: the option that moves each listener of ``txmsg broker`` (named by ``PortInUse.listener``)
PORT_OPTIONS = {"name server": "--namesrv-port", "broker": "--broker-port", "gRPC": "--grpc-port"}


@click.command("broker")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind (routes publish it)."
)
@click.option(
    "--broker-ip1",
    default=None,
    help="brokerIP1: publish this IP in routes instead of --host (NAT, a fault proxy).",
)
@click.option(
    "--namesrv-port",
    default=9876,
    show_default=True,
    type=int,
    help="Name server port (0 = any free).",
)
@click.option(
    "--broker-port", default=10911, show_default=True, type=int, help="Broker port (0 = any free)."
)
@click.option(
    "--data-dir", default="./txmsg-broker-data", show_default=True, type=click.Path(path_type=Path)
)
@click.option(
    "--log-dir", default="./txmsg-broker-logs", show_default=True, type=click.Path(path_type=Path)
)
@click.option(
    "--transaction-timeout-ms",
    default=6000,
    show_default=True,
    type=click.IntRange(1),
    help="transactionTimeOut: age before a half message is first checked.",
)
@click.option(
    "--check-interval-ms",
    default=None,
    type=click.IntRange(1),
    help="transactionCheckInterval: how often half messages are scanned "
    "[default: 60000 as 4.9.8, 30000 as 5.3.3].",
)
@click.option(
    "--check-max",
    default=15,
    show_default=True,
    type=click.IntRange(1),
    help="transactionCheckMax: checks before a half message is discarded.",
)
@click.option(
    "--flush",
    type=click.Choice(["async", "sync"]),
    default="async",
    show_default=True,
    help="sync: fdatasync before acknowledging each send.",
)
@click.option("--auto-create-topics/--no-auto-create-topics", default=True, show_default=True)
@click.option(
    "--enforce-topic-types/--no-enforce-topic-types",
    default=True,
    show_default=True,
    help="Reject messages whose kind does not match the topic's message.type.",
)
@click.option(
    "--learn-producers-from-sends/--no-learn-producers-from-sends",
    default=False,
    show_default=True,
    help="Also learn check-back channels from sends (non-standard; a real broker: heartbeats only).",
)
@click.option(
    "--transaction-log-level",
    type=click.Choice(["DEBUG", "INFO", "WARN", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="DEBUG makes commits visible in transaction.log.",
)
@click.option(
    "--broker-version",
    type=click.Choice(["4.9.8", "5.3.3"]),
    default=None,
    help="Behave as this real broker where they differ: 5.3.3 batches commit/rollback op records "
    "(--transaction-op-batch-interval-ms), scans every 30 s, logs 5.x lines "
    "[default: 5.3.3 with --grpc-port, else 4.9.8].",
)
@click.option(
    "--transaction-op-batch-interval-ms",
    default=None,
    type=click.IntRange(0),
    help="transactionOpBatchInterval (5.1+): write commit/rollback op records in batches this often; "
    "0 = at once. A transaction-timeout below it makes the broker check finished transactions "
    "[default: 3000 as 5.3.3; 4.9.8 writes at once].",
)
@click.option(
    "--transaction-op-msg-max-size",
    default=4096,
    show_default=True,
    type=click.IntRange(1),
    help="transactionOpMsgMaxSize (5.1+): a batch of op records is written early at this size (bytes).",
)
@click.option(
    "--file-reserved-time",
    default=72,
    show_default=True,
    type=click.IntRange(0),
    help="fileReservedTime (hours): a half message born longer ago is discarded without a "
    "check-back, as Java's check service does.",
)
@click.option(
    "--max-process-time-ms",
    default=60000,
    type=click.IntRange(1),
    hidden=True,
    help="Java's MAX_PROCESS_TIME_LIMIT (a constant, not a broker setting): one check pass stops "
    "after this long. For tests.",
)
@click.option(
    "--log-format",
    type=click.Choice(["4", "5"]),
    default=None,
    help="transaction.log format of remoting traffic: 4 = RocketMQ 4.9.8 (quoted header, bname); "
    "5 = RocketMQ 5.1+ (unquoted, no bname, an INFO line per check-back). gRPC is always 5 "
    "[default: the --broker-version's].",
)
@click.option(
    "--delay-scale",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.0001),
    help="Multiply RocketMQ's delay levels (retry back-off), e.g. 0.01 for tests.",
)
@click.option(
    "--max-message-size", default=4 * 1024 * 1024, show_default=True, type=click.IntRange(1)
)
@click.option(
    "--acl",
    default=None,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Enforce RocketMQ 4.9 ACL from this plain_acl.yml (accounts, PUB/SUB permissions, admin, "
    "white addresses; HMAC-SHA1 signatures). Clients then need access_key/secret_key.",
)
@click.option(
    "--grpc-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Also serve RocketMQ 5's gRPC protocol (the proxy's) on this port (0 = any free); "
    "needs the `grpc` extra.",
)
@click.option(
    "--brokers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 26),
    help="Several brokers (broker-a, broker-b, ...): one name server process and one process per "
    "broker, stores and logs under <data-dir>/<name>, <log-dir>/<name>; ports from --broker-port "
    "on (the next free one each); --grpc-port on broker-a only.",
)
@click.option(
    "--namesrv-addr",
    default=None,
    help="Register with these name servers (host:port[;host:port]) instead of serving one "
    "(how --brokers runs each broker).",
)
@click.option("--broker-name", default="broker-a", show_default=True)
@click.option(
    "--rebalance-lock-max-live-time-ms",
    default=60000,
    show_default=True,
    type=click.IntRange(1),
    help="Lifetime of an orderly consumer's queue lock after its last renewal "
    "(Java: -Drocketmq.broker.rebalance.lockMaxLiveTime).",
)
@click.option(
    "--register-interval-ms",
    default=30000,
    show_default=True,
    type=click.IntRange(1000),
    help="With --namesrv-addr: how often the broker registers again (registerNameServerPeriod).",
)
@click.option(
    "--restartable-ports",
    is_flag=True,
    default=False,
    hidden=True,
    help="Ports given as 0 are chosen below the kernel's ephemeral range, so a restart can bind "
    "them again (BrokerProcess: tests that restart a broker).",
)
@click.option(
    "--manual-clock/--no-manual-clock",
    default=False,
    help="Tests only: the broker's time (check-backs, transactionTimeOut, op batches, delay levels, "
    "queue locks) stands still until a test advances it (txmsg_broker.time_control).",
)
def broker(**options: Any) -> None:
    """Run an embedded RocketMQ-compatible name server + broker until SIGINT/SIGTERM."""
    exit_with_parent()
    options["transaction_log_level"] = str(options["transaction_log_level"]).upper()
    if options["log_format"] is not None:
        options["log_format"] = int(options["log_format"])
    count = options.pop("brokers")
    if count > 1:
        _serve_cluster(count, options)
        return
    try:
        config = BrokerConfig(**options)  # click has validated each option against its type
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        asyncio.run(_serve(config))
    except PortInUse as exc:
        raise click.ClickException(
            f"cannot start the broker: {exc}. Is another broker using the port? "
            f"Choose another with {PORT_OPTIONS.get(exc.listener, '--broker-port')} (0 = any free port)."
        ) from exc
    except OSError as exc:
        raise click.ClickException(
            f"cannot start the broker: {exc}. Is another broker using the ports? "
            "Choose others with --namesrv-port/--broker-port (0 = any free port)."
        ) from exc


async def _serve(config: BrokerConfig) -> None:
    instance = Broker(config)
    await instance.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    click.echo(ready_line(instance))
    sys.stdout.flush()
    await stop.wait()
    click.echo("txmsg broker shutting down (flushing)")
    await instance.stop()
    click.echo("txmsg broker stopped")


def _serve_cluster(count: int, options: dict[str, Any]) -> None:
    """``--brokers N``: start the cluster's processes, print every address, stop them on SIGINT/SIGTERM."""
    if options.get("namesrv_addr"):
        raise click.UsageError("--brokers starts its own name server; leave out --namesrv-addr")
    fixed = {
        k: options.pop(k) for k in ("data_dir", "log_dir", "host", "namesrv_port", "broker_port")
    }
    options.pop("namesrv_addr", None)
    options.pop("broker_name", None)
    options.pop("restartable_ports", None)  # each BrokerProcess asks for it when its ports are 0
    settings = {k: v for k, v in options.items() if v is not None}
    cluster = BrokerCluster(
        fixed["data_dir"],
        fixed["log_dir"],
        brokers=count,
        host=fixed["host"],
        namesrv_port=fixed["namesrv_port"],
        broker_port=fixed["broker_port"],
        **settings,
    )
    stop = {"now": False}

    def request_stop(*_: object) -> None:
        stop["now"] = True

    old = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            cluster.start(timeout=60)
        except (RuntimeError, TimeoutError, OSError) as exc:
            cluster.kill()
            raise click.ClickException(
                f"cannot start the brokers: {exc}. Are the ports in use? "
                "Choose others with --namesrv-port/--broker-port (0 = any free port)."
            ) from exc
        click.echo(cluster.ready_line())
        sys.stdout.flush()
        reported: set[str] = set()
        while not stop["now"]:
            for name, proc in zip(cluster.broker_addrs, cluster.brokers, strict=True):
                if not proc.running and name not in reported:
                    reported.add(name)
                    click.echo(f"txmsg broker: {name} is not running (see {proc.console_path})")
            time.sleep(0.2)
        click.echo("txmsg broker shutting down (flushing)")
    finally:
        cluster.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    click.echo("txmsg broker stopped")


@click.command("namesrv")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=9876, show_default=True, type=int, help="0 = any free port.")
@click.option(
    "--log-dir", default="./txmsg-namesrv-logs", show_default=True, type=click.Path(path_type=Path)
)
@click.option(
    "--restartable-ports",
    is_flag=True,
    default=False,
    hidden=True,
    help="--port 0 is chosen below the kernel's ephemeral range, so a restart can bind it again.",
)
def namesrv(host: str, port: int, log_dir: Path, restartable_ports: bool) -> None:
    """Run a stand-alone name server (brokers register with it; used by ``txmsg broker --brokers N``)."""
    exit_with_parent()

    async def serve() -> None:
        server = NameServer(host, port, log_dir, restartable=restartable_ports)
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        click.echo(f"txmsg namesrv accepting connections: {server.addr} (logs {log_dir})")
        sys.stdout.flush()
        await stop.wait()
        await server.stop()

    try:
        asyncio.run(serve())
    except OSError as exc:
        raise click.ClickException(
            f"cannot start the name server: {exc}; choose another --port"
        ) from exc


# --- topic admin ---------------------------------------------------------------------------------
def _call(
    addr: str,
    code: int,
    ext: dict[str, str],
    timeout: float = 5.0,
    credentials: tuple[str, str] | None = None,
) -> tuple[int, str, bytes]:
    response = call(addr, code, ext, timeout=timeout, credentials=credentials)
    return response.code, response.remark or "", response.body


def _masters(namesrv: str) -> list[str]:
    """Master addresses the name server lists (GET_BROKER_CLUSTER_INFO), as mqadmin's ``-c``."""
    try:
        code, remark, body = _call(namesrv, GET_BROKER_CLUSTER_INFO, {})
    except OSError as exc:
        raise click.ClickException(f"cannot reach the name server at {namesrv}: {exc}") from exc
    if code != SUCCESS:
        raise click.ClickException(
            f"name server {namesrv} refused cluster info (code {code}): {remark}"
        )
    try:
        info = fastjson.loads(body)
        masters = [
            b["brokerAddrs"].get("0") or b["brokerAddrs"].get(0)
            for b in info.get("brokerAddrTable", {}).values()
        ]
    except (ValueError, AttributeError, KeyError) as exc:
        raise click.ClickException(f"unexpected cluster info from {namesrv}: {exc}") from exc
    found = [m for m in masters if m]
    if not found:
        raise click.ClickException(f"no master broker registered at {namesrv}")
    return found


@click.group("topic")
def topic() -> None:
    """Manage topics on a RocketMQ cluster (ours or a real one)."""


@topic.command("create")
@click.argument("name")
@click.option(
    "--type",
    "message_type",
    type=click.Choice(["NORMAL", "TRANSACTION", "FIFO", "DELAY", "MIXED"], case_sensitive=False),
    default=None,
    help="RocketMQ 5 message.type attribute.",
)
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help="Name server address.")
@click.option("--queues", default=4, show_default=True, type=click.IntRange(1, 1024))
@click.option(
    "--access-key",
    envvar="TXMSG_ACCESS_KEY",
    default=None,
    help="ACL: an admin account's access key (default $TXMSG_ACCESS_KEY).",
)
@click.option(
    "--secret-key",
    envvar="TXMSG_SECRET_KEY",
    default=None,
    show_envvar=False,
    help="ACL: its secret key (default $TXMSG_SECRET_KEY).",
)
def create_topic(
    name: str,
    message_type: str | None,
    namesrv: str,
    queues: int,
    access_key: str | None,
    secret_key: str | None,
) -> None:
    """Create or update topic NAME on every master broker (like ``mqadmin updateTopic``)."""
    keys = (access_key, secret_key) if access_key and secret_key else None
    masters = _masters(namesrv)
    ext = {
        "topic": name,
        "defaultTopic": "TBW102",
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    if message_type:
        ext["attributes"] = f"+message.type={message_type.upper()}"
    for addr in masters:
        try:
            code, remark, _ = _call(addr, UPDATE_AND_CREATE_TOPIC, ext, credentials=keys)
        except OSError as exc:
            raise click.ClickException(f"cannot reach broker {addr}: {exc}") from exc
        if code != SUCCESS:
            raise click.ClickException(
                f"broker {addr} refused to create {name} (code {code}): {remark}"
            )
        click.echo(f"create topic to {addr} success.")
    suffix = f" message.type={message_type.upper()}" if message_type else ""
    click.echo(
        f"TopicConfig [topicName={name}, readQueueNums={queues}, writeQueueNums={queues}{suffix}]"
    )


# --- consumer group admin --------------------------------------------------------------------------
@click.group("group")
def group() -> None:
    """Manage consumer groups on a RocketMQ cluster (ours or a real one)."""


@group.command("create")
@click.argument("name")
@click.option(
    "--orderly/--no-orderly",
    default=False,
    show_default=True,
    help="consumeMessageOrderly: a RocketMQ 5 proxy delivers a FIFO topic in order only to such a group.",
)
@click.option("--retry-max-times", default=16, show_default=True, type=click.IntRange(0, 1000))
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help="Name server address.")
@click.option(
    "--access-key",
    envvar="TXMSG_ACCESS_KEY",
    default=None,
    help="ACL: an admin account's access key (default $TXMSG_ACCESS_KEY).",
)
@click.option(
    "--secret-key",
    envvar="TXMSG_SECRET_KEY",
    default=None,
    show_envvar=False,
    help="ACL: its secret key (default $TXMSG_SECRET_KEY).",
)
def create_group(
    name: str,
    orderly: bool,
    retry_max_times: int,
    namesrv: str,
    access_key: str | None,
    secret_key: str | None,
) -> None:
    """Create or update consumer group NAME on every master broker (like ``mqadmin updateSubGroup``)."""
    from .subscription_groups import UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, group_config_body  # noqa: PLC0415 - admin only

    keys = (access_key, secret_key) if access_key and secret_key else None
    body = group_config_body(name, orderly=orderly, retry_max_times=retry_max_times)
    for addr in _masters(namesrv):
        try:
            response = call(
                addr, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body, timeout=5.0, credentials=keys
            )
        except OSError as exc:
            raise click.ClickException(f"cannot reach broker {addr}: {exc}") from exc
        if response.code != SUCCESS:
            raise click.ClickException(
                f"broker {addr} refused to create group {name} (code {response.code}): {response.remark}"
            )
        click.echo(f"create subscription group to {addr} success.")
    click.echo(
        f"SubscriptionGroupConfig [groupName={name}, consumeMessageOrderly={str(orderly).lower()}]"
    )
