"""Griffe extension: render the reST idioms of txmsg's docstrings as Markdown.

txmsg's docstrings are written for readers of the source (and Sphinx habits): ``:class:`X```
roles, ``text::`` before an indented example, and reST simple tables.  mkdocstrings renders
docstrings as Markdown, where those show up literally.  This rewrites them at load time, so the
source keeps its style and the site reads cleanly:

* ``:class:`~txmsg.errors.TxMsgError``` (any role) -> ```TxMsgError``` (``~``: the last part);
* ``Example::`` followed by an indented block -> ``Example:`` (the block already is Markdown code);
* a reST simple table (``====  ====`` borders) -> a fenced text block, shown as written.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")
_LITERAL_INTRO = re.compile(r"(?m)(\S)::[ \t]*$")
_BORDER = re.compile(r"^\s*=+(?:\s+=+)+\s*$")


def _role(match: re.Match[str]) -> str:
    tilde, text, target = match.groups()
    name = (target or text).strip()
    if tilde:
        name = name.rsplit(".", 1)[-1]
    return f"`{text.strip() if target else name}`"


def _tables(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if _BORDER.match(lines[i]):
            borders = [i]
            j = i + 1
            while j < len(lines) and len(borders) < 3:
                if _BORDER.match(lines[j]):
                    borders.append(j)
                elif not lines[j].strip():
                    break
                j += 1
            if len(borders) == 3:
                indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                out += [f"{indent}```text", *lines[i : borders[2] + 1], f"{indent}```"]
                i = borders[2] + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def rest_to_markdown(text: str) -> str:
    """The docstring ``text`` with reST roles, literal-block intros and simple tables converted."""
    text = _ROLE.sub(_role, text)
    text = _LITERAL_INTRO.sub(r"\1:", text)
    return _tables(text)


class RestToMarkdown(griffe.Extension):
    """Applies :func:`rest_to_markdown` to every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rest_to_markdown(obj.docstring.value)
