"""The demo's topics on a cluster: create them the way ``txmsg topic create`` does, or say how.

``ensure_topics`` asks a name server for the cluster info (GET_BROKER_CLUSTER_INFO) and sends
UPDATE_AND_CREATE_TOPIC to every master it lists, exactly as ``txmsg topic create`` and
``mqadmin updateTopic -c CLUSTER`` do.  A cluster may refuse (ACL without admin rights, a
locked-down production cluster): then nothing has been sent yet, and :class:`ClusterNotReady`
carries the command lines an operator runs, so the demo can print them and stop.

A refusal is not fatal when the topic already exists on every master (an operator created it
after the last refusal): the demo then uses it as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_QUEUES = 4
MESSAGE_TYPE = "TRANSACTION"
"""RocketMQ 5 brokers take transactional messages only on TRANSACTION topics (4.x ignores it)."""


class ClusterNotReady(RuntimeError):
    """The demo cannot run against this cluster yet; ``str()`` says what to do."""


@dataclass
class Cluster:
    """What a name server says about its brokers (masters only)."""

    name_server: str
    """The address that answered."""
    masters: dict[str, str] = field(default_factory=dict)
    """broker name -> master address"""
    clusters: dict[str, list[str]] = field(default_factory=dict)
    """cluster name -> broker names"""


def _loads(body: bytes) -> Any:
    """A name server's JSON: fastjson leaves numeric map keys unquoted (``{0:"host:port"}``), so
    the broker plugin's reader parses it (loaded on first use, like :func:`_call`)."""
    from txmsg_broker.fastjson import loads  # noqa: PLC0415

    return loads(body)


def _call(
    addr: str,
    code: int,
    ext: dict[str, str],
    timeout: float,
    credentials: tuple[str, str] | None = None,
) -> tuple[int, str, bytes]:
    # the broker plugin's tiny remoting client, on first use: `txmsg demo` loads this module
    from txmsg_broker.rawclient import call  # noqa: PLC0415

    response = call(addr, code, ext, timeout=timeout, credentials=credentials)
    return response.code, response.remark or "", response.body


def cluster_info(name_server: str, *, timeout: float = 5.0) -> Cluster:
    """Brokers of the first name server in ``host:port[;host:port]`` that answers; raises
    ClusterNotReady naming every address tried when none does."""
    from txmsg_broker.codec import GET_BROKER_CLUSTER_INFO, SUCCESS  # noqa: PLC0415 - the broker plugin on first use: `txmsg demo` loads this module

    problems: list[str] = []
    for addr in [a.strip() for a in name_server.split(";") if a.strip()]:
        try:
            code, remark, body = _call(addr, GET_BROKER_CLUSTER_INFO, {}, timeout)
        except OSError as exc:
            problems.append(f"cannot reach {addr}: {exc}")
            continue
        if code != SUCCESS:
            problems.append(f"{addr} refused the cluster info (code {code}): {remark}")
            continue
        try:
            data = _loads(body)
            info = Cluster(addr)
            for name, broker in (data.get("brokerAddrTable") or {}).items():
                master = (broker.get("brokerAddrs") or {}).get("0")
                if master:
                    info.masters[str(name)] = str(master)
            for cluster, names in (data.get("clusterAddrTable") or {}).items():
                info.clusters[str(cluster)] = sorted(str(n) for n in names)
        except (ValueError, AttributeError, TypeError) as exc:
            problems.append(f"{addr} answered cluster info that is not JSON as expected: {exc}")
            continue
        if not info.masters:
            problems.append(f"{addr} lists no master broker (is a broker registered?)")
            continue
        return info
    raise ClusterNotReady(
        f"cannot use the name server {name_server}: {'; '.join(problems)}.\n"
        "Check that the name server runs and the address is right "
        "(--name-server, TXMSG_NAME_SERVER or name_server in txmsg.toml); "
        "leave all three unset and `txmsg demo` starts its own embedded broker."
    )


def topic_masters(name_server: str, topic: str, *, timeout: float = 5.0) -> set[str]:
    """Names of the brokers that have ``topic`` writable, per the name server (empty: no route)."""
    from txmsg_broker.codec import GET_ROUTEINFO_BY_TOPIC, SUCCESS  # noqa: PLC0415 - the broker plugin on first use: `txmsg demo` loads this module

    try:
        code, _, body = _call(name_server, GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, timeout)
    except OSError:
        return set()
    if code != SUCCESS:
        return set()
    try:
        data = _loads(body)
        return {
            str(q.get("brokerName"))
            for q in data.get("queueDatas") or []
            if int(q.get("perm", 0)) & 2
        }
    except (ValueError, AttributeError, TypeError):
        return set()


def create_commands(name_server: str, cluster: Cluster | None, topics: Sequence[str]) -> list[str]:
    """The command lines that create ``topics`` (mqadmin for any cluster, txmsg's equivalent)."""
    names = sorted(cluster.clusters) if cluster and cluster.clusters else ["<cluster name>"]
    lines = [
        f"mqadmin updateTopic -n {name_server} -c {name} -t {topic} "
        f"-r {DEFAULT_QUEUES} -w {DEFAULT_QUEUES}"
        f"   # RocketMQ 5: add  -a +message.type={MESSAGE_TYPE}"
        for topic in topics
        for name in names
    ]
    lines.extend(
        f"txmsg topic create {topic} --namesrv {name_server} --type {MESSAGE_TYPE} "
        f"--queues {DEFAULT_QUEUES}"
        for topic in topics
    )
    return lines


def ensure_topics(
    name_server: str,
    topics: Sequence[str],
    *,
    queues: int = DEFAULT_QUEUES,
    timeout: float = 5.0,
    credentials: tuple[str, str] | None = None,
) -> list[str]:
    """Create (or update) ``topics`` as TRANSACTION topics on every master of the cluster
    (``credentials``: access and secret key, which sign the requests for a broker with ACL; it
    takes an admin account to create topics there).

    Returns one line per topic saying what was done.  Raises :class:`ClusterNotReady` when the
    name server cannot be used, or when a broker refuses and the topic is not already on every
    master; its message lists the commands that create the topics.
    """
    from txmsg_broker.codec import SUCCESS, UPDATE_AND_CREATE_TOPIC  # noqa: PLC0415 - the broker plugin on first use: `txmsg demo` loads this module

    cluster = cluster_info(name_server, timeout=timeout)
    done: list[str] = []
    refused: dict[str, list[str]] = {}
    for topic in topics:
        ext = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(queues),
            "writeQueueNums": str(queues),
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
            "attributes": f"+message.type={MESSAGE_TYPE}",
        }
        problems: list[str] = []
        for broker, addr in sorted(cluster.masters.items()):
            try:
                code, remark, _ = _call(addr, UPDATE_AND_CREATE_TOPIC, ext, timeout, credentials)
            except OSError as exc:
                problems.append(f"{broker} ({addr}) unreachable: {exc}")
                continue
            if code != SUCCESS:
                problems.append(f"{broker} ({addr}) refused (code {code}): {remark}")
        if not problems:
            done.append(f"topic {topic}: created/updated on {', '.join(sorted(cluster.masters))}")
            continue
        present = topic_masters(cluster.name_server, topic, timeout=timeout)
        if set(cluster.masters) <= present:
            done.append(
                f"topic {topic}: exists on every broker; used as it is ({'; '.join(problems)})"
            )
            continue
        refused[topic] = problems
    if refused:
        lines = [f"  {topic}: {'; '.join(why)}" for topic, why in refused.items()]
        commands = [f"  {c}" for c in create_commands(cluster.name_server, cluster, list(refused))]
        raise ClusterNotReady(
            "the cluster did not let the demo create its topics, and nothing has been sent:\n"
            + "\n".join(lines)
            + "\nCreate them (one of the two forms below, as an operator with the rights to), "
            "then run the demo again:\n" + "\n".join(commands)
        )
    return done


def proxy_topic_types(
    endpoint: str, topic: str, *, settings: Mapping[str, Any], timeout: float = 5.0
) -> set[str] | None:
    """Message types a RocketMQ 5 proxy accepts on ``topic`` (gRPC QueryRoute); None when the
    topic does not exist.  Raises OSError when the endpoint cannot be used."""
    # the 5.x client and grpcio only when the demo runs on rocketmq5 (extra `rocketmq5`)
    import grpc  # noqa: PLC0415
    from rocketmq import ClientConfiguration, Credentials  # noqa: PLC0415
    from rocketmq.grpc_protocol import (  # noqa: PLC0415
        Address,
        AddressScheme,
        Code,
        Endpoints,
        MessageType,
        MessagingServiceStub,
        QueryRouteRequest,
        Resource,
    )
    from rocketmq.v5.util import ClientId  # noqa: PLC0415
    from rocketmq.v5.util.signature import Signature  # noqa: PLC0415

    host, _, port = endpoint.rpartition(":")
    namespace = str(settings.get("namespace") or "")
    config = ClientConfiguration(
        endpoint,
        Credentials(settings.get("access_key") or "", settings.get("secret_key") or ""),
        namespace=namespace,
    )
    request = QueryRouteRequest(
        topic=Resource(name=topic, resource_namespace=namespace),
        endpoints=Endpoints(
            scheme=AddressScheme.IPv4, addresses=[Address(host=host, port=int(port))]
        ),
    )
    channel = (
        grpc.secure_channel(endpoint, grpc.ssl_channel_credentials())
        if settings.get("tls")
        else grpc.insecure_channel(endpoint)
    )
    try:
        response = MessagingServiceStub(channel).QueryRoute(
            request, metadata=Signature.metadata(config, ClientId().client_id), timeout=timeout
        )
    except grpc.RpcError as exc:
        raise OSError(f"{exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()
    if response.status.code == Code.TOPIC_NOT_FOUND:
        return None
    if response.status.code != Code.OK:
        raise OSError(
            f"QueryRoute refused ({Code.Name(response.status.code)}): {response.status.message}"
        )
    return {
        MessageType.Name(kind)
        for queue in response.message_queues
        for kind in queue.accept_message_types
    }


def ensure_topics_via_proxy(
    endpoints: str, topics: Sequence[str], *, settings: Mapping[str, Any], timeout: float = 5.0
) -> list[str]:
    """``rocketmq5`` against a 5.x proxy with no name server given: the gRPC protocol has no
    call that creates a topic, so check that each topic exists and takes transactional
    messages, else raise :class:`ClusterNotReady` (nothing sent) with the commands that create
    it.  Give the cluster's name server too (``--name-server``) and the demo creates them."""
    problems: list[str] = []
    missing: list[str] = []
    done: list[str] = []
    for topic in topics:
        for addr in [a.strip() for a in endpoints.split(";") if a.strip()]:
            try:
                types = proxy_topic_types(addr, topic, settings=settings, timeout=timeout)
            except OSError as exc:
                problems.append(f"cannot use the endpoint {addr}: {exc}")
                continue
            if types is None:
                missing.append(topic)
                problems.append(f"topic {topic} does not exist on {addr}")
            elif MESSAGE_TYPE not in types:
                missing.append(topic)
                problems.append(
                    f"topic {topic} on {addr} takes {', '.join(sorted(types)) or 'no'} messages, "
                    f"not {MESSAGE_TYPE}"
                )
            else:
                done.append(f"topic {topic}: exists on {addr} as {MESSAGE_TYPE}; used as it is")
            break
        else:
            raise ClusterNotReady(
                f"cannot use the endpoints {endpoints}: {'; '.join(problems)}.\n"
                "Check that the RocketMQ 5 proxy runs and the address is right (--endpoints, "
                "TXMSG_ENDPOINTS or endpoints in txmsg.toml); leave all three unset and "
                "`txmsg demo --backend rocketmq5` starts its own embedded broker."
            )
    if missing:
        commands = [f"  {c}" for c in create_commands("<name server>", None, missing)]
        raise ClusterNotReady(
            "the demo's topics are not ready on the proxy, and nothing has been sent:\n"
            + "\n".join(f"  {p}" for p in problems)
            + "\nA RocketMQ 5 proxy cannot create topics over gRPC. Create them (as an operator "
            "with the rights to), or pass the cluster's name server (--name-server) and the "
            "demo creates them; then run it again:\n" + "\n".join(commands)
        )
    return done
