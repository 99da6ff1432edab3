"""``python -m txmsg_broker.fuzz``: the long fuzz mode (see :mod:`txmsg_broker.fuzz.run`)."""

import sys

from txmsg_broker.fuzz.run import main

sys.exit(main())
