"""MkDocs hook: links from a docs page to repository files outside ``docs/``.

Pages such as ``rocketmq-facts.md`` link to ``../tests/data/README.md`` so that they work when read
on a forge or in an editor.  The built site has no such page, and ``mkdocs build --strict`` would
fail on the link; this turns each such link into its text followed by the repository path in
code, e.g. "real broker logs (`tests/data/README.md` in the repository)".  Links inside ``docs/``
and to web addresses are left alone (and still checked by mkdocs).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]+)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    page_dir = posixpath.dirname(page.file.src_uri)

    def replace(match: re.Match[str]) -> str:
        target = match.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("/"):
            return match.group(0)
        resolved = posixpath.normpath(posixpath.join(page_dir, target))
        if not resolved.startswith("../"):
            return match.group(0)  # inside docs/: mkdocs checks it
        path = resolved[len("../") :]
        text = match.group("text")
        if text.strip("`") == path or text.strip("`").rstrip("/") in path:
            return f"{text} (in the repository)"
        return f"{text} (`{path}` in the repository)"

    return _LINK.sub(replace, markdown)
