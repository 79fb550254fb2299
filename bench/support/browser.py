"""Headless Chromium for the dashboard tests and benchmark (Debian's chromium + chromedriver).

Driven by Selenium with the driver given explicitly, so Selenium Manager never downloads one.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


@contextmanager
def chromium() -> Iterator:
    """A fresh headless Chromium (own profile dir) that records console messages."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
        raise RuntimeError("chromium/chromedriver missing: run scripts/install_chromium.sh")
    profile = tempfile.mkdtemp(prefix="raas-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver) -> list[str]:  # untyped: a Selenium WebDriver
    """Console messages at error level since the last call (reading drains the log)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
