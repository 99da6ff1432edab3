"""Which broker a log file belongs to, from its path.

Why from the path: a broker's log lines never name the broker (4.9.5+ headers carry ``bname``, but
only on end-transaction lines), while operators keep one directory per broker (``broker-a/``,
``rocketmqlogs/broker-a_0/`` with ``isolateLogEnable``, or a copy per host). The job aggregates by
file and names the brokers afterwards from the few distinct paths, so this costs nothing per line.

Default rule: for a file under a directory given as input, the first directory below that input
(``logs/`` + ``broker-a/transaction.log`` -> ``broker-a``); a file directly inside it (or a file or
glob given as input) takes the name of the directory that holds it, one level up for the broker's
``otherdays/`` rotation folder. ``--broker-regex`` replaces the rule: group 1 (or the whole match)
of the first match in the file's path.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlparse

from txmsg_health.inputs import HealthInputError

ROTATION_DIRS = ("otherdays",)


def local_path(uri: str) -> str:
    """``file:///a/b%20c`` -> ``/a/b c``; other URIs keep their path part."""
    if "://" not in uri and not uri.startswith("file:"):
        return uri
    return unquote(urlparse(uri).path)


def _holder(path: str) -> str:
    parent = os.path.dirname(path)
    name = os.path.basename(parent)
    if name in ROTATION_DIRS:
        name = os.path.basename(os.path.dirname(parent))
    return name or "-"


def name_for(file_uri: str, roots: list[str], regex: str | None = None) -> str:
    """The broker name of one input file; ``roots`` are the resolved inputs (dirs, files, globs)."""
    path = local_path(file_uri)
    if regex:
        m = re.search(regex, path)
        if not m:
            return _holder(path)
        return m.group(1) if m.re.groups else m.group(0)
    best = ""
    for r in roots:
        root = local_path(r).rstrip("/")
        if root and path.startswith(root + "/") and len(root) > len(best) and not _is_glob(root):
            best = root
    if best and not os.path.isfile(best):
        first = path[len(best) + 1 :].split("/", 1)
        if len(first) == 2 and first[0] not in ROTATION_DIRS:
            return first[0]
        return os.path.basename(best) or "-"
    return _holder(path)


def _is_glob(p: str) -> bool:
    return any(c in p for c in "*?[{")


def names(files: list[str], roots: list[str], regex: str | None = None) -> dict[str, str]:
    """File URI -> broker name for every distinct file."""
    if regex:
        try:
            re.compile(regex)
        except re.error as exc:
            raise HealthInputError(
                f"--broker-regex {regex!r}: {exc}; give a Python regex whose "
                "group 1 is the broker name, e.g. 'logs/([^/]+)/'"
            ) from exc
    return {f: name_for(f, roots, regex) for f in files}
