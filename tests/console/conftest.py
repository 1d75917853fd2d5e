"""The console served for real (uvicorn on a free port, in a thread) against a real PostgreSQL,
and a real headless browser (Debian's chromium through chromedriver, driven by Selenium)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.console.console_helpers import REBOUND, serve
from tests.support.services import import_or_missing, missing


@pytest.fixture
def console() -> Callable[..., Any]:
    return serve


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    import_or_missing("selenium", "test")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        missing("Chromium", "apt-get install chromium chromium-driver (Debian packages)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    # a foreign DNS name that resolves to this machine (a DNS-rebinding page's view)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-gpu",
                f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
