"""The sample as a newcomer runs it: config file -> injector -> TxMsg on the real client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import wait_until

from txmsg import ConfigError, LocalTransactionState
from txmsg.sqla import duplicates_absorbed
from txmsg_samples.order import cart, logistics, points
from txmsg_samples.order.events import TOPIC
from txmsg_samples.order.orders import PAID, create_order
from txmsg_samples.order.settings import DEFAULT_PATH, OrderSampleSettings, load
from txmsg_samples.order.wiring import OrderSample


def test_shipped_config_file_loads() -> None:
    config, settings = load(DEFAULT_PATH, env={})
    assert config.producer.group == "order-tx"
    assert settings.orders_db.startswith("sqlite:///")
    config, _ = load(DEFAULT_PATH, env={"TXMSG_NAME_SERVER": "10.0.0.5:9876"})
    assert config.name_server == "10.0.0.5:9876"


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "txmsg.toml"
    bad.write_text('name_server = "x:1"\n[order_sample]\norders_dbb = "sqlite://"\n')
    with pytest.raises(ConfigError, match=r"order_sample\.orders_dbb"):
        load(bad, env={})
    bad.write_text('name_servr = "x:1"\n')
    with pytest.raises(ConfigError, match="name_servr"):
        load(bad, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.toml", env={})


def test_sample_end_to_end(txmsg_broker: Any, tmp_path: Path) -> None:
    pytest.importorskip("txmsg_rocketmq.backend")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "txmsg_broker",
            "topic",
            "create",
            TOPIC,
            "--namesrv",
            txmsg_broker.namesrv_addr,
            "--type",
            "TRANSACTION",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    config, _ = load(DEFAULT_PATH, env={"TXMSG_NAME_SERVER": txmsg_broker.namesrv_addr})
    config = config.model_copy(update={"client_log_dir": str(tmp_path / "client")})
    settings = OrderSampleSettings(
        orders_db=f"sqlite:///{tmp_path / 'orders.db'}",
        points_db=f"sqlite:///{tmp_path / 'points.db'}",
        logistics_db=f"sqlite:///{tmp_path / 'logistics.db'}",
        cart_db=f"sqlite:///{tmp_path / 'cart.db'}",
    )
    sample = OrderSample(config, settings)
    with sample.orders_db() as s, s.begin():
        for i in range(3):
            create_order(s, f"o-{i}", "u-1", 1000 * (i + 1), [f"o-{i}-x"])
    with sample.cart_db() as s, s.begin():
        for i in range(3):
            cart.add_to_cart(s, "u-1", f"o-{i}-x")
    with sample:
        results = [sample.orders.pay(f"o-{i}") for i in range(3)]
        assert [r.local_state for r in results] == [LocalTransactionState.COMMIT] * 3
        assert {sample.orders.status(f"o-{i}") for i in range(3)} == {PAID}

        def counts() -> tuple[int, int, int]:
            with sample.points_db() as s1, sample.logistics_db() as s2, sample.cart_db() as s3:
                return (
                    len(points.entries(s1)),
                    len(logistics.shipments(s2)),
                    len(cart.checkouts(s3)),
                )

        wait_until(
            lambda: counts() == (3, 3, 3),
            timeout=30,
            message=lambda: f"3 points entries, shipments and checkouts; have {counts()}",
        )
        with sample.points_db() as s:
            assert points.total_balance(s) == 10 + 20 + 30
        with sample.cart_db() as s:
            assert cart.items(s) == set()
        assert duplicates_absorbed(sample.points_db) == 0
