"""``dashboard.html``: one self-contained page, viewable offline.

Why inline SVG and no chart library: the page must open from a mail attachment or a CI artefact
with no network, and a plotting bundle would add megabytes for two kinds of chart. Everything
(CSS, charts) is inline; Jinja2 escapes every name taken from the logs.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from html import escape
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

_HERE = os.path.dirname(os.path.abspath(__file__))
W, H, PAD = 720, 170, 36


def _line_chart(rows: list[dict[str, Any]], share_known: bool) -> str:
    """UNKNOW answers per window (bars) and, where COMMITs are logged, the UNKNOW share (line)."""
    if not rows:
        return '<div class="meta">no windows</div>'
    pts = [
        (
            r["window_start"],
            int(r["unknown"]),
            int(r["unknown"]) + int(r["rollback"]) + int(r["commit"]),
        )
        for r in rows
    ]
    n = len(pts)
    top = max(1, max(p[1] for p in pts))
    bw = (W - 2 * PAD) / n
    bars = []
    line = []
    for i, (_, unk, tot) in enumerate(pts):
        h = (H - 2 * PAD) * unk / top
        x = PAD + i * bw
        bars.append(
            f'<rect x="{x:.1f}" y="{H - PAD - h:.1f}" width="{max(bw - 1, 0.8):.1f}" '
            f'height="{h:.1f}" fill="#d33c3c" opacity="0.75"/>'
        )
        if share_known and tot:
            y = H - PAD - (H - 2 * PAD) * unk / tot
            line.append(f"{x + bw / 2:.1f},{y:.1f}")
    first, last = _fmt(pts[0][0]), _fmt(pts[-1][0])
    share = (
        f'<polyline points="{" ".join(line)}" fill="none" stroke="#2b59c3" stroke-width="1.5"/>'
        f'<text x="{W - PAD}" y="{PAD - 8}" text-anchor="end">line: UNKNOW share (0–100 %)</text>'  # noqa: RUF001 - a range dash
        if line
        else ""
    )
    return (
        f'<svg class="chart" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
        f'aria-label="UNKNOW over time">'
        f'<text x="{PAD}" y="{PAD - 8}">bars: UNKNOW at send per window (max {top})</text>'
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#9aa1ad"/>'
        + "".join(bars)
        + share
        + f'<text x="{PAD}" y="{H - PAD + 14}">{escape(first)} UTC</text>'
        f'<text x="{W - PAD}" y="{H - PAD + 14}" text-anchor="end">{escape(last)} UTC</text></svg>'
    )


def _fmt(ts: Any) -> str:
    return ts.strftime("%Y-%m-%d %H:%M") if isinstance(ts, datetime) else str(ts)


def _histogram(hist: dict[str, int]) -> str:
    """Transactions by number of check answers seen."""
    if not hist:
        return '<div class="meta">no check answers in the logs</div>'
    items = sorted((int(k), v) for k, v in hist.items())
    top = max(v for _, v in items)
    bw = min(60.0, (W - 2 * PAD) / len(items))
    parts = []
    for i, (k, v) in enumerate(items):
        h = (H - 2 * PAD) * v / top
        x = PAD + i * bw
        parts.append(
            f'<rect x="{x:.1f}" y="{H - PAD - h:.1f}" width="{bw - 4:.1f}" height="{h:.1f}" fill="#2b59c3"/>'
            f'<text x="{x + bw / 2 - 2:.1f}" y="{H - PAD + 14}" text-anchor="middle">{k}</text>'
            f'<text x="{x + bw / 2 - 2:.1f}" y="{H - PAD - h - 3:.1f}" text-anchor="middle">{v}</text>'
        )
    return (
        f'<svg class="chart" id="checks-histogram" width="{W}" height="{H + 10}" role="img" '
        f'aria-label="checks per transaction"><text x="{PAD}" y="{PAD - 20}">transactions by check '
        f"answers seen (x: checks, y: transactions)</text>"
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#9aa1ad"/>'
        + "".join(parts)
        + "</svg>"
    )


def render(summary: dict[str, Any], series: dict[str, list[dict[str, Any]]]) -> str:
    env = Environment(loader=FileSystemLoader(_HERE), autoescape=select_autoescape(["html", "j2"]))
    tpl = env.get_template("dashboard.html.j2")
    groups = summary["groups"]
    order = list(summary["flagged"]) + sorted(g for g in groups if not groups[g]["flagged"])
    charts = {
        g: _line_chart(series.get(g, []), groups[g]["commits_visible"]) for g in summary["flagged"]
    }
    never = [g for g in summary["flagged"] if _never_arrives(groups[g]["reasons"])]
    return tpl.render(
        s=summary,
        order=order,
        charts=charts,
        never=never,
        rule_names=_rule_names,
        histogram=_histogram(summary.get("checks_histogram", {})),
    )


def _never_arrives(reasons: list[str]) -> bool:
    return any(r.startswith("check_never_arrives:") for r in reasons)


def _rule_names(reasons: list[str]) -> str:
    """ "check_never_arrives: ..." -> "never arrives": the short names for a matrix cell."""
    names = [
        r.split(":", 1)[0].replace("check_never_arrives", "never arrives").replace("_", " ")
        for r in reasons
        if not r.startswith("broker_scope:")
    ]
    return ", ".join(names)


def write(out: str, summary: dict[str, Any], series: dict[str, list[dict[str, Any]]]) -> str:
    """Replace ``out/dashboard.html`` atomically: a browser reloading it never sees half a page."""
    path = os.path.join(out, "dashboard.html")
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".dashboard.", suffix=".html")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(render(summary, series))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path
