"""The frozen state of a :class:`~txmsg.registry.ListenerRegistry`: open for declarations until
an app includes or starts it, then closed with the reason, which the error repeats."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from txmsg.errors import LifecycleError


class Freezer:
    """Open or frozen (with why), guarded by the registry's own lock so that a declaration and a
    freeze never interleave: a listener is either recorded before the freeze or refused."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._reason: str | None = None

    @property
    def frozen(self) -> bool:
        return self._reason is not None

    def freeze(self, reason: str) -> None:
        """Frozen for good; the first reason wins."""
        with self._lock:
            if self._reason is None:
                self._reason = reason

    @contextlib.contextmanager
    def freezing(self, reason: str) -> Iterator[None]:
        """Frozen while the block runs and for good if it succeeds; if it raises, this freeze is
        undone (an earlier one stays), so a failed start leaves the registry open for the fix."""
        with self._lock:
            froze = self._reason is None
            if froze:
                self._reason = reason
        try:
            yield
        except BaseException:
            if froze:
                with self._lock:
                    self._reason = None
            raise

    def check_open(self, what: str) -> None:
        """Raise :class:`LifecycleError` naming ``what`` if frozen."""
        with self._lock:
            self.check_open_locked(what)

    def check_open_locked(self, what: str) -> None:
        """:meth:`check_open` for a caller that holds the lock already."""
        if self._reason is not None:
            raise LifecycleError(
                f"cannot {what}: this registry is frozen because {self._reason}. Declare every "
                "listener before the app starts (import the module that declares it before "
                "app.start()), and decorate a module-level registry before app.include(registry)"
            )
