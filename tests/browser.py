"""A real headless Chromium for page tests, driven by Selenium over the system chromedriver.

Nothing here downloads a browser or a driver: it uses Debian's ``chromium`` and ``chromium-driver``
(``/usr/bin/chromium``, ``/usr/bin/chromedriver``) or the paths in ``$CHROMIUM`` and
``$CHROMEDRIVER``, and says which piece is missing when one is.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1440,1000",
    "--force-device-scale-factor=1",
)


def _find(env: str, *names: str) -> str | None:
    explicit = os.environ.get(env)
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for name in names:
        found = shutil.which(name) or (
            f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file() else None
        )
        if found:
            return found
    return None


def missing() -> str | None:
    """Say what a browser test lacks (and how to install it), or None when it can run."""
    gaps = []
    if _find("CHROMIUM", "chromium", "chromium-browser") is None:
        gaps.append("the chromium browser (apt-get install chromium, or set $CHROMIUM)")
    if _find("CHROMEDRIVER", "chromedriver") is None:
        gaps.append("chromedriver (apt-get install chromium-driver, or set $CHROMEDRIVER)")
    if importlib.util.find_spec("selenium") is None:
        gaps.append("the selenium package (pip install selenium)")
    return "missing " + "; ".join(gaps) if gaps else None


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """Start headless Chromium with a fresh profile and yield its Selenium driver; quit it after.

    Raises:
        RuntimeError: a piece is missing (call :func:`missing` first to skip instead).
    """
    reason = missing()
    if reason is not None:
        raise RuntimeError(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = _find("CHROMIUM", "chromium", "chromium-browser")
    driver_path = _find("CHROMEDRIVER", "chromedriver")
    assert binary is not None
    assert driver_path is not None
    with tempfile.TemporaryDirectory(prefix="journaled-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console and CSP errors
        # An explicit driver path keeps Selenium Manager from fetching a browser or a driver.
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
        try:
            yield driver
        finally:
            driver.quit()
