"""The documentation site (issue 70): `mkdocs build --strict` from docs/ (every page in the
navigation, no broken link or anchor), served on 127.0.0.1 and opened in the tests' headless
Chromium, whose search finds a recipe key; a screenshot of the home page is kept for the record
(docs/images/site-home.png, written again by HPCTRAIN_KEEP_SCREENSHOT=1)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_strictly_with_every_page_in_its_navigation(site):
    pages = {p.relative_to(ROOT / "docs").with_suffix("").as_posix()
             for p in (ROOT / "docs").rglob("*.md")}
    built = {p.parent.relative_to(site).as_posix() if p.parent != site else "index"
             for p in site.rglob("index.html")}
    assert pages - {"index"} <= built, sorted(pages - built)
    assert (site / "search" / "search_index.json").is_file()


def test_the_site_s_search_finds_a_recipe_key(site, tmp_path):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from browser import start_chromium

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver = start_chromium()
    try:
        driver.get(f"http://127.0.0.1:{server.server_port}/")
        assert "hpctrain" in driver.title
        screenshot = tmp_path / "site-home.png"
        driver.save_screenshot(str(screenshot))
        if os.environ.get("HPCTRAIN_KEEP_SCREENSHOT"):
            shutil.copyfile(screenshot, ROOT / "docs" / "images" / "site-home.png")
        query = driver.find_element(By.CSS_SELECTOR, "input[data-md-component=search-query]")
        driver.execute_script("arguments[0].focus()", query)
        deadline = time.monotonic() + 30  # the search worker indexes the site first
        while time.monotonic() < deadline:
            query.clear()
            query.send_keys("compile_cache")
            try:
                WebDriverWait(driver, 3).until(lambda d: d.find_elements(
                    By.CSS_SELECTOR, ".md-search-result__item a"))
                break
            except TimeoutException:  # the index not ready yet
                continue
        found = [a.get_attribute("href") for a in driver.find_elements(
            By.CSS_SELECTOR, ".md-search-result__item a")]
        assert any("reference/recipe" in href for href in found), found
    finally:
        driver.quit()
        server.shutdown()
