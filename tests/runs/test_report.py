"""The report page in a real headless Chromium: the tests that train, in this process or in an
`hpctrain` process of their own (the others are tests/unit/test_report.py)."""

import json
from pathlib import Path

import pytest

from hpctrain.report.series import read_run
from hpctrain.units import fmt_bytes


@pytest.fixture(scope="session")
def chromium():
    from browser import start_chromium

    driver = start_chromium()
    try:
        yield driver
    finally:
        driver.quit()


def look_at(driver, page: Path, screenshot: Path) -> dict:
    """Open the page and check it as a reader would; what was seen."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver.get_log("browser"), driver.get_log("performance")  # forget earlier pages
    driver.get(page.as_uri())
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    requests = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    fetched = {m["params"]["request"]["url"] for m in requests
               if m["method"] == "Network.requestWillBeSent"}
    assert fetched <= {page.as_uri()}, fetched  # the page itself, nothing else
    seen = {}
    for figure in driver.find_elements(By.CSS_SELECTOR, "figure"):
        chart = figure.find_element(By.CSS_SELECTOR, ".by-step svg")
        points = chart.find_elements(By.CSS_SELECTOR, "circle.point")
        assert len(points) == int(chart.get_attribute("data-points")) > 0
        box = chart.rect
        inside = [p for p in points if box["x"] <= p.rect["x"] <= box["x"] + box["width"]
                  and box["y"] <= p.rect["y"] <= box["y"] + box["height"]]
        assert len(inside) == len(points) and chart.is_displayed()
        seen[figure.get_attribute("data-panel")] = len(points)
    first = driver.find_element(By.CSS_SELECTOR, "figure .by-step circle.point")
    ActionChains(driver).move_to_element(first).perform()
    tip = driver.find_element(By.ID, "tip")
    assert tip.is_displayed() and "| step " in tip.text
    seen["tooltip"] = tip.text
    driver.find_element(By.ID, "axis").click()
    by_time = driver.find_elements(By.CSS_SELECTOR, "figure .by-time svg")
    assert by_time and all(s.is_displayed() for s in by_time)
    assert all(s.find_elements(By.CSS_SELECTOR, "circle.point") for s in by_time)
    driver.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000
    return seen


def test_the_default_runs_own_report_shows_every_curve(default_recipe_run, chromium, tmp_path):
    _, summary = default_recipe_run
    run = Path(summary["run_dir"])
    page = run / "report.html"  # written by the run itself when it ended
    assert page.is_file() and (run / "report-loss.png").is_file()
    seen = look_at(chromium, page, tmp_path / "default-report.png")
    expected = set(read_run(run).panels)
    assert {"loss", "accuracy", "learning rate", "throughput (samples/s)"} <= expected
    assert set(seen) - {"tooltip"} == expected  # every panel the run recorded, drawn
    text = page.read_text()
    assert "best_val_accuracy" in text and "config.yaml" in text and "<script src" not in text


def test_a_report_of_three_runs_one_of_them_resumed(tmp_path, run_cli, tiny, chromium):
    for lr in ("0.05", "0.1", "0.2"):
        code, _, err = run_cli("run", "default", *tiny(f"optim.lr={lr}", f"run_name=lr{lr}",
                                                       "train.max_steps=6"))
        assert code == 0, err
    code, _, _ = run_cli("run", "default", *tiny("optim.lr=0.2", "run_name=lr0.2",
                                                 "train.max_steps=10", "resume=auto"))
    runs = [tmp_path / "runs" / f"lr{lr}" for lr in ("0.05", "0.1", "0.2")]
    assert not (runs[0] / "report.html").exists()  # report=false: the tiny runs' setting
    resumed = read_run(runs[2])
    assert [step for step, _ in resumed.restarts] == [8]  # the first record of the 2nd start
    out = tmp_path / "compare" / "three.html"
    code, printed, _ = run_cli("report", *map(str, runs), "--out", str(out), "--json")
    assert code == 0 and str(out) in json.loads(printed)
    assert (out.parent / "three-accuracy.png").is_file()
    seen = look_at(chromium, out, tmp_path / "three-runs.png")
    text = out.read_text()
    assert "Settings that differ" in text and "optim.lr" in text and "restarted at step 8" in text
    assert all(f"lr{lr}: train loss" in text for lr in ("0.05", "0.1", "0.2"))
    points = {"train loss": 0, "validation loss": 0}
    for run in runs:
        for curve in read_run(run).panels["loss"]:
            if curve.label in points:
                points[curve.label] += len(curve.points)
    assert points["train loss"] == 6 // 2 * 2 + 10 // 2  # 3 + 3 + 5 train losses
    assert points["validation loss"] > 0  # a classifier's evaluations record their loss
    assert seen["loss"] == points["train loss"] + points["validation loss"]


def test_a_report_shows_the_memory_prediction_written_into_the_run(tmp_path, run_cli, tiny):
    settings = tiny("run_name=measured", "train.max_steps=2")
    assert run_cli("run", "default", *settings)[0] == 0
    run = tmp_path / "runs" / "measured"
    code, out, _ = run_cli("memory", "default", *settings, "--out", str(run), "--json")
    predicted = json.loads(out)["estimate"]
    assert code in (0, 3) and (run / "default-memory.json").is_file()
    assert run_cli("report", str(run))[0] == 0
    text = (run / "report.html").read_text()
    assert f"peak allocated {fmt_bytes(predicted['peak_allocated_bytes'])}" in text
    assert "measured peak" in text and "host_rss" in text
    measured = json.loads((run / "summary.json").read_text())["peak_memory_bytes"]
    assert f"<td>{fmt_bytes(measured)}</td>" in text  # as the terminal's summary prints it
    assert str(measured) not in text
