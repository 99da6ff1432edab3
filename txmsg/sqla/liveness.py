"""Who holds a lease, and whether that holder is gone: shared by the orderly in-flight journal
(:mod:`txmsg.sqla.journal`) and the outbox relay's SQLite lease (:mod:`txmsg.sqla.outbox.relay`).

An owner is ``"<host>:<pid>:<random>"``.  A lease whose time ran out is gone; so is one held by
a process of this host (the same host name and pid namespace) that no longer exists, at once,
without waiting for the lease to run out.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime


def host_identity() -> str:
    """This process's "host" for the liveness check: the host name plus, on Linux, the pid
    namespace.  Why the namespace: containers that share the host's name (host networking) but
    not its pids would otherwise take each other's live consumers for dead ones."""
    name = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return name
    digits = "".join(ch for ch in namespace if ch.isdigit())
    return f"{name}#{digits}" if digits else name


def new_owner(host: str) -> str:
    """An owner name for this process on ``host`` (:func:`host_identity`), unique per call."""
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (somebody else's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process: alive
        return True
    return True


def holder_gone(owner: str, lease_until: datetime, now: datetime, *, host: str) -> bool:
    """Whether the lease of ``owner`` (until ``lease_until``) is nobody's any more: it ran out,
    or ``owner`` is a process of ``host`` (this process's host) that no longer exists."""
    if lease_until < now:
        return True
    owner_host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return owner_host == host and pid.isdigit() and not pid_alive(int(pid))
