"""The argument checks every backend runs before starting a client (txmsg.backend)."""

from __future__ import annotations

import pytest

from txmsg.backend import check_sender_arguments, check_subscription_arguments
from txmsg.errors import ConfigError, InvalidNameError
from txmsg.names import rocketmq_rule

RULES = (rocketmq_rule,)


def test_sender_arguments_name_the_backend_and_the_group() -> None:
    check_sender_arguments("pg", ["orders"], 1, owner="Some backend", rules=RULES)
    with pytest.raises(InvalidNameError, match=r"^Some backend: producer group 'bad group'"):
        check_sender_arguments("bad group", [], 1, owner="Some backend", rules=RULES)
    with pytest.raises(InvalidNameError, match=r"^Some backend, group pg: topic 'bad topic'"):
        check_sender_arguments("pg", ["orders", "bad topic"], 1, owner="Some backend", rules=RULES)
    with pytest.raises(ConfigError, match=r"check_concurrency must be an int >= 1 \(got 0\)"):
        check_sender_arguments("pg", [], 0, owner="Some backend", rules=RULES)


def test_subscription_arguments_name_the_backend_and_the_consumer_group() -> None:
    check_subscription_arguments("orders", "cg", owner="Some backend", rules=RULES)
    with pytest.raises(InvalidNameError, match=r"^Some backend: consumer group 'bad group'"):
        check_subscription_arguments("orders", "bad group", owner="Some backend", rules=RULES)
    with pytest.raises(InvalidNameError, match=r"^Some backend, consumer group cg: topic 'x y'"):
        check_subscription_arguments("x y", "cg", owner="Some backend", rules=RULES)
