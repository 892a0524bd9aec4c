"""A real headless Chromium for the report tests, driven through Selenium and Debian's
chromium-driver (installed when missing): no browser download, no network. The page's
console and its network requests are recorded by Chromium's logs."""

from __future__ import annotations

import shutil

from debian import ensure_installed

PACKAGES = {"chromium": "chromium", "chromedriver": "chromium-driver"}


def start_chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    ensure_installed(PACKAGES)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,2000", "--disable-background-networking",
                 "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
