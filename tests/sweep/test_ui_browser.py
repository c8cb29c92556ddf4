"""`perception-sweep ui` in a real browser (headless Chromium through Playwright): the link it prints
first opens the runs of the sweep side by side by fold, the deciding horizon's val_auc column visible at
1280 and at 1920 px without a click. Screenshots of both widths are kept in the test's directory."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from perception.testing.sweep_store import SweepSpec, build_sweep, new_store
from perception.testing.mlflow_server import free_port
from tests.sweep.test_ui import plan_parent

BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")
SPEC = SweepSpec(mu_a=[0.6] * 5, mu_b=[0.6, 0.6, 0.6, 0.6, 0.7], n_windows=200)


def start_ui(env: dict, port: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        ["perception-sweep", "ui", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines, first = [], None
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if m := re.match(r"^open first: (http\S+)$", line.strip()):
            first = m.group(1)
        if "Ctrl-C stops it" in line:
            break
    assert first and "Ctrl-C stops it" in lines[-1], "".join(lines)
    return proc, first


@pytest.mark.slow(seconds=90)
def test_the_first_link_shows_the_deciding_column_at_1280_and_1920_px(tmp_path):
    from playwright.sync_api import sync_playwright

    browser = next(filter(None, map(shutil.which, BROWSERS)), None)
    assert browser, f"no Chromium on PATH ({', '.join(BROWSERS)}): .ci/run installs one"
    home = tmp_path / "home"
    uri, client = new_store(home)
    build_sweep(client, "ui-browser", SPEC)
    plan_parent(client, "ui-browser")  # the ci plan: h40 decides
    env = {**os.environ, "PERCEPTION_HOME": str(home), "MLFLOW_TRACKING_URI": uri}
    proc, url = start_ui(env, free_port())
    try:
        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=os.path.realpath(browser), args=["--no-sandbox"])
            for width, height in ((1280, 800), (1920, 1080)):
                page = chromium.new_page(viewport={"width": width, "height": height})
                page.goto(url)
                page.wait_for_selector("text=Group: 0", timeout=90_000)  # grouped by fold, as the view says
                header = page.get_by_text("val_auc_h40", exact=True)
                header.first.wait_for(timeout=30_000)
                box = header.first.bounding_box()
                table = page.get_by_text("Run Name", exact=True).first.bounding_box()
                runs = page.get_by_text(re.compile(r"^(shared|per_horizon)-f[012]$"))
                page.screenshot(path=str(tmp_path / f"ui_{width}.png"))
                assert runs.count() == 6  # the sweep's six trainings, nothing else
                # in the viewport, right of the run names and not under the assistant panel on the right
                assert table["x"] < box["x"] and box["x"] + box["width"] <= 0.75 * width, (width, box)
                page.close()
            chromium.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    assert (tmp_path / "ui_1280.png").stat().st_size > 10_000 and (tmp_path / "ui_1920.png").stat().st_size > 10_000
