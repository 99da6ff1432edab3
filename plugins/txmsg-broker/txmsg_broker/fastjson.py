"""JSON the way a RocketMQ 4.9.8 name server writes it, and a reader for it.

The Java name server serialises its answers with fastjson's defaults, which leave the numeric keys
of maps unquoted: a route's ``"brokerAddrs":{0:"127.0.0.1:10911"}`` and the cluster info's
``brokerAddrTable`` come back that way (verified against a real 4.9.8 broker built by hand: cluster
info always, whatever version the client announces; docs/backend-design.md).  That is not JSON,
so a strict ``json.loads`` of a real name server's answer fails.  The embedded name server writes
the same form, so a tool that parses it strictly fails in our tests too, not only on a real
cluster; every reader in txmsg goes through :func:`loads`.
"""

from __future__ import annotations

import json
import re
from typing import Any

_QUOTED_NUMERIC_KEY = re.compile(r'(?<!\\)"(-?\d+)":')
_BARE_NUMERIC_KEY = re.compile(r"([{,])\s*(-?\d+)\s*:")


def dumps(value: Any) -> bytes:
    """``value`` as fastjson writes it: compact, numeric map keys unquoted."""
    text = json.dumps(value, separators=(",", ":"))
    return _QUOTED_NUMERIC_KEY.sub(r"\1:", text).encode()


def loads(body: bytes | str) -> Any:
    """Parse strict JSON or fastjson's non-strict form (numeric keys come back as strings)."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    return json.loads(_BARE_NUMERIC_KEY.sub(r'\1"\2":', text))
