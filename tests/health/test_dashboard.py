"""dashboard.html renders offline in headless Chromium and shows the flagged groups first."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from txmsg_health import job

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.skip("chromium is not installed: run scripts/setup.sh (apt-get install chromium)")
    return exe


def test_dashboard_renders_in_chromium(
    generated_result: job.JobResult, tmp_path: Path, artifacts: Path
) -> None:
    exe = _chromium()
    s = generated_result.summary
    html = Path(s["parquet"]).parent / "dashboard.html"
    text = html.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), (
        "page must not load anything remote"
    )

    profile = tmp_path / "profile"
    dom = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", html.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    cards = re.findall(r'<div class="card( never)?" data-group="([^"]+)">', dom)
    assert [g for _, g in cards] == s["flagged"], "flagged groups are shown first, in summary order"
    assert cards, "flagged groups are shown first, in summary order"
    # check-backs that never arrive lead the page, in their own section
    never = [g for n, g in cards if n]
    assert never
    assert [g for _, g in cards][: len(never)] == never
    assert dom.index('id="never-arrives"') < dom.index("Other flagged groups")
    # several brokers: the flagged groups x brokers matrix, "ok" where a group is healthy
    matrix = dom[dom.index('id="matrix"') :]
    matrix = matrix[: matrix.index("</table>")]
    assert all(b in matrix for b in s["brokers"])
    assert 'class="good">ok<' in matrix
    assert 'class="bad">never arrives' in matrix
    flagged_pos = dom.index('id="flagged"')
    table_pos = dom.index("<h2>All groups</h2>")
    assert flagged_pos < table_pos
    for g in s["flagged"]:
        assert g in dom[flagged_pos:table_pos]
        assert s["groups"][g]["reasons"][0].split(":")[0] in dom
    assert 'id="checks-histogram"' in dom
    assert dom.count('<svg class="chart"') == len(s["flagged"]) + 1
    # the table lists every group, flagged rows first
    rows = re.findall(r'<tr class="(flag)?"><td class="g">([^<]+)</td>', dom)
    assert [g for _, g in rows][: len(s["flagged"])] == s["flagged"]
    assert len(rows) == len(s["groups"])

    shot = artifacts / "health_dashboard.png"
    subprocess.run(
        [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--window-size=1280,2000",
            f"--screenshot={shot}",
            html.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000
