"""The README's picture of a sweep in the MLflow UI, taken by a real browser.

    perception-sweep local --sweep-id ci-demo experiment=ci      # a small real sweep (minutes on 2 cores)
    pip install -e ".[docs]" && apt-get install chromium-headless-shell   # or any Chromium
    python docs/mlflow_ui_screenshot.py --sweep-id ci-demo [--grouping variant|fold] [--out docs/mlflow_ui_folds.png]

Starts `perception-sweep ui` on the current PERCEPTION_HOME (its local store), opens the link it prints
first (or the `--grouping` one) in headless Chromium through Playwright, waits for the grouped runs and
saves a PNG of the page as the link opens it, the UI's assistant panel and shared-view banner included. Playwright's
own browser download needs the internet, so the
browser is a system one (`--browser`, default: the first Chromium on PATH).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
URL_LINE = re.compile(r"^grouped by (variant|fold)\b.*?(http\S+)$")


def start_ui(sweep_id: str, port: int) -> tuple[subprocess.Popen, dict[str, str]]:
    proc = subprocess.Popen(
        ["perception-sweep", "ui", "--sweep-id", sweep_id, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    urls: dict[str, str] = {}
    for line in proc.stdout:
        print(line, end="")
        if m := URL_LINE.match(line.strip()):
            urls[m.group(1)] = m.group(2)
        if "Ctrl-C stops it" in line:
            return proc, urls
    raise SystemExit(f"perception-sweep ui ended with {proc.wait()} before serving")


def screenshot(url: str, out: Path, browser: str, width: int, height: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=browser, args=["--no-sandbox"])
        page = chromium.new_page(viewport={"width": width, "height": height})
        page.goto(url)
        page.wait_for_selector("text=Group:", timeout=60_000)  # the shared view's grouping has applied
        time.sleep(2)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        chromium.close()


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--sweep-id", required=True)
    a.add_argument("--grouping", choices=("variant", "fold"), default="fold")
    a.add_argument("--out", type=Path, default=Path(__file__).with_name("mlflow_ui_folds.png"))
    a.add_argument("--browser", default=next(filter(None, map(shutil.which, BROWSERS)), None))
    a.add_argument("--port", type=int, default=5701)
    a.add_argument("--size", default="1280x760", help="viewport WIDTHxHEIGHT")
    args = a.parse_args()
    if not args.browser:
        raise SystemExit(f"no Chromium found ({', '.join(BROWSERS)}); pass --browser PATH")
    width, height = map(int, args.size.split("x"))
    proc, urls = start_ui(args.sweep_id, args.port)
    try:
        screenshot(urls[args.grouping], args.out, os.path.realpath(args.browser), width, height)
        print(f"wrote {args.out}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
