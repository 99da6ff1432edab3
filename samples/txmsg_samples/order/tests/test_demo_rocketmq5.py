"""``txmsg demo`` on the rocketmq5 backend (issue 14.6): the official 5.x client over gRPC, on the
demo's own embedded broker (started with its gRPC endpoint) or on a 5.x proxy given by
``--endpoints`` / ``TXMSG_ENDPOINTS``; how the backend is chosen and what is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from txmsg_broker.testing import create_topic, unique

from txmsg_samples.order.cluster import ClusterNotReady, ensure_topics_via_proxy
from txmsg_samples.order.demo import DemoOptions, _where_line, backend_target, demo
from txmsg_samples.order.demo_run import DEMO_NAMES

pytest.importorskip("txmsg_rocketmq5.backend")

SMALL = ["--orders", "16", "--threads", "4", "--seed", "7", "--timeout", "90"]
SMALL += ["--fail-rate", "0.2", "--slow-rate", "0.2", "--lose-ack-rate", "0.2"]
TOPIC = DEMO_NAMES.topic


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No txmsg.toml in the working directory and no TXMSG_* configuration from outside."""
    monkeypatch.chdir(tmp_path)
    for name in ("TXMSG_CONFIG", "TXMSG_NAME_SERVER", "TXMSG_BACKEND", "TXMSG_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def cluster5(txmsg_broker_factory: Any) -> Any:
    """A separately started broker with its gRPC endpoint (a 5.x proxy's stand-in); check_max 30
    as the demo's own, consumer retries after ~0.1 s."""
    return txmsg_broker_factory(check_max=30, delay_scale=0.01, grpc_port=0)


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(demo, args, env=env, catch_exceptions=False)


def consistent(result: Result) -> bool:
    return "CONSISTENT" in result.output and "INCONSISTENT" not in result.output


def test_demo_on_rocketmq5_embedded_broker_is_consistent(clean_env: Path) -> None:
    """`txmsg demo --backend rocketmq5`: its own broker with a gRPC port, the topic created as
    TRANSACTION, the services on the 5.x client at that endpoint; faults injected, all settle."""
    result = invoke(["--backend", "rocketmq5", *SMALL, "--workdir", "w", "--keep"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(
        "txmsg demo on its own embedded broker over its gRPC endpoint, backend rocketmq5 "
        "(from --backend)"
    ), lines[0]
    assert f"topic {TOPIC}: created/updated on broker-a" in result.output
    assert "gRPC endpoint 127.0.0.1:" in result.output
    assert consistent(result), result.output
    assert "resolved by check-back" in result.output
    # the services really ran on the 5.x client: its consumer threads logged the absorbed duplicates
    log = (clean_env / "w" / "demo.log").read_text()
    assert "txmsg5-consume-" in log
    broker_log = (clean_env / "w" / "broker" / "logs" / "broker.log").read_text()
    assert "grpc server start success" in broker_log


def test_endpoints_run_against_your_proxy(cluster5: Any, clean_env: Path) -> None:
    """--endpoints alone picks rocketmq5.  A proxy cannot create topics over gRPC: with the topic
    missing the demo stops before sending and prints the commands; with --name-server too it
    creates the topic and runs on the proxy."""
    endpoint = cluster5.grpc_endpoint
    refused = invoke(["--endpoints", endpoint, *SMALL])
    assert refused.exit_code == 1, refused.output
    out = refused.output
    assert out.splitlines()[0].startswith(
        f"txmsg demo against your RocketMQ 5 proxy at {endpoint} (from --endpoints), "
        "backend rocketmq5 (from --endpoints)"
    )
    assert f"topic {TOPIC} does not exist on {endpoint}" in out
    assert "cannot create topics over gRPC" in out
    assert f"txmsg topic create {TOPIC} --namesrv <name server> --type TRANSACTION" in out
    assert "paying orders" not in out
    assert "CONSISTENT" not in out

    result = invoke(
        ["--endpoints", endpoint, "--name-server", cluster5.namesrv_addr, *SMALL, "--workdir", "w"]
    )
    assert result.exit_code == 0, result.output
    assert f"topic {TOPIC}: created/updated" in result.output
    assert f"services up against {endpoint}" in result.output
    assert consistent(result), result.output
    assert not (clean_env / "w" / "broker").exists()  # no broker of its own

    (line,) = ensure_topics_via_proxy(endpoint, [TOPIC], settings={})
    assert line == f"topic {TOPIC}: exists on {endpoint} as TRANSACTION; used as it is"


def test_proxy_topic_of_the_wrong_type_is_refused(cluster5: Any) -> None:
    topic = unique("demo5_normal")
    create_topic(cluster5.namesrv_addr, topic, message_type="NORMAL")
    with pytest.raises(ClusterNotReady, match=rf"topic {topic} on .* takes NORMAL messages"):
        ensure_topics_via_proxy(cluster5.grpc_endpoint, [topic], settings={})


def test_unreachable_endpoints_say_what_to_do(clean_env: Path) -> None:
    with pytest.raises(ClusterNotReady, match=r"cannot use the endpoints 127\.0\.0\.1:1"):
        ensure_topics_via_proxy("127.0.0.1:1", [TOPIC], settings={}, timeout=2.0)


# ---- choosing the backend (no broker needed) ---------------------------------------------------
def test_backend_from_environment_and_toml(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert backend_target(None, None).backend == "rocketmq"  # nothing set: the default

    monkeypatch.setenv("TXMSG_BACKEND", "rocketmq5")
    chosen = backend_target(None, None)
    assert (chosen.backend, chosen.backend_from, chosen.endpoints) == (
        "rocketmq5",
        "TXMSG_BACKEND",
        None,  # the built-in default endpoint does not count: embedded broker
    )
    monkeypatch.delenv("TXMSG_BACKEND")

    (clean_env / "txmsg.toml").write_text(
        'backend = "rocketmq5"\nendpoints = "10.0.0.5:8081"\nnamespace = "shop"\n'
    )
    chosen = backend_target(None, None)
    assert chosen.backend == "rocketmq5"
    assert chosen.backend_from == "backend in txmsg.toml"
    assert (chosen.endpoints, chosen.endpoints_from) == ("10.0.0.5:8081", "endpoints in txmsg.toml")
    assert chosen.settings == {"namespace": "shop"}
    # --backend wins over the file
    assert backend_target("rocketmq", None).backend == "rocketmq"


def test_where_line_on_rocketmq5() -> None:
    embedded = _where_line(DemoOptions(backend="rocketmq5", backend_from="TXMSG_BACKEND"), None)
    assert embedded.startswith(
        "txmsg demo on its own embedded broker over its gRPC endpoint, backend rocketmq5 "
        "(from TXMSG_BACKEND) (no endpoints set; --endpoints HOST:PORT"
    )
    # the default backend keeps the line it always had
    assert _where_line(DemoOptions(), None).startswith(
        "txmsg demo on its own embedded broker (no name server set;"
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--backend", "rocketmq", "--endpoints", "127.0.0.1:8081"],
            {},
            "--endpoints is for backend rocketmq5",
        ),
        (
            ["--backend", "rocketmq5", "--name-server", "127.0.0.1:9876"],
            {},
            "backend rocketmq5 against your cluster needs its proxy's gRPC endpoints",
        ),
        ([], {"TXMSG_BACKEND": "mymod:Factory"}, "the demo runs on backend rocketmq or rocketmq5"),
        (["--endpoints", "garbage"], {}, "Invalid value for '--endpoints'"),
        (["--backend", "kafka"], {}, "Invalid value for '--backend'"),
    ],
)
def test_refused_combinations(
    args: list[str], env: dict[str, str], message: str, clean_env: Path
) -> None:
    result = invoke([*args, *SMALL], env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "paying orders" not in result.output
