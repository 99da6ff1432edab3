"""``python -m benchmarks.fuzz_broker``: the broker's long fuzz mode, kept in the benchmark table.

The harness lives with the broker (:mod:`txmsg_broker.fuzz`); this is its thin wrapper, so the
options, the output and the ``RESULT fuzz_broker ...`` line are those of
``python -m txmsg_broker.fuzz``.
"""

from __future__ import annotations

import sys

from txmsg_broker.fuzz.run import main

if __name__ == "__main__":
    sys.exit(main())
