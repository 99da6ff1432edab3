"""Input paths and the broker's time zone: checked on the driver before Spark starts reading.

Why here: Spark's own error for a missing path is a long Java trace; users need one sentence
saying which path and what to do. Remote URIs (hdfs://, s3a://, ...) are passed through
untouched, since only the cluster can see them.
"""

from __future__ import annotations

import glob
import os
import re
from datetime import UTC, timedelta, timezone

_GLOB = re.compile(r"[*?\[{]")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_TZ = re.compile(r"^(?:UTC|GMT)?\s*([+-])(\d{1,2})(?::?(\d{2}))?$")


class HealthInputError(ValueError):
    """The input cannot be analysed; the message says what to change."""


def resolve(paths: list[str] | tuple[str, ...]) -> list[str]:
    """Return Spark-readable paths: local ones made absolute, URIs and globs as given."""
    if not paths:
        raise HealthInputError("no input given: pass broker log files, directories or globs")
    out: list[str] = []
    for p in paths:
        if _SCHEME.match(p) and not p.startswith("file://"):
            out.append(p)
            continue
        local = p[len("file://") :] if p.startswith("file://") else p
        local = os.path.expanduser(local)
        if _GLOB.search(local):
            if not glob.glob(local, recursive=True):
                raise HealthInputError(f"{p}: the pattern matches no file; check the path")
            out.append(os.path.abspath(local))
        elif os.path.exists(local):
            out.append(os.path.abspath(local))
        else:
            raise HealthInputError(
                f"{p}: no such file or directory; give broker log files (transaction.log, "
                "broker.log, rotated *.log.gz), a broker's log directory, a glob, or a URI"
            )
    return out


def parse_tz(text: str) -> timezone:
    """Parse ``+08:00``/``-0500``/``UTC+8``/``Z``; the broker always logs in UTC+8 by default."""
    t = text.strip()
    if t.upper() in ("Z", "UTC", "GMT"):
        return UTC
    m = _TZ.match(t.upper())
    if not m:
        raise HealthInputError(f"--tz {text!r}: use an offset such as +08:00, -05:00 or UTC")
    sign = -1 if m.group(1) == "-" else 1
    hours, minutes = int(m.group(2)), int(m.group(3) or 0)
    if hours > 14 or minutes > 59:
        raise HealthInputError(f"--tz {text!r}: offset out of range")
    return timezone(sign * timedelta(hours=hours, minutes=minutes))
