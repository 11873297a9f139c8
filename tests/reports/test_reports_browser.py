"""The HTML report in a real headless Chromium: every chart drawn, no console error, a screenshot."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlmodel import SQLModel

from broker.decisions import DecisionRecord
from broker.reports import write_report
from tests.reports.builders import synthetic
from tests.reports.conftest import fill

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
    "--window-size=1366,900",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
]


@pytest.fixture
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        if os.environ.get("CI"):
            pytest.fail("chromium/chromedriver missing: .ci/run installs them")
        pytest.skip("chromium and chromium-driver are not installed (apt-get install -y chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_MANAGER_PATH", "/bin/false")  # Selenium Manager must never run (network)
    monkeypatch.setenv("SE_OFFLINE", "true")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    profile = tmp_path / "profile"
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield d
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_the_html_report_renders_every_chart_without_console_errors(driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    url = f"sqlite:///{tmp_path}/broker.db"
    engine = create_engine(url)
    SQLModel.metadata.create_all(engine, tables=[DecisionRecord.__table__])  # type: ignore[attr-defined]
    fill(engine, synthetic(300, seed=21))
    engine.dispose()
    page = write_report(tmp_path / "report.html", "html", database_url=url)

    driver.get(page.as_uri())
    expected = int(driver.find_element(By.TAG_NAME, "main").get_attribute("data-charts"))
    svgs = driver.find_elements(By.CSS_SELECTOR, "figure > svg")
    assert expected == 5 and len(svgs) == expected
    for svg in svgs:
        box = driver.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.width, r.height];", svg)
        assert box[0] > 100 and box[1] > 50, box
        # something was drawn inside: the chart has paths with a real extent
        assert driver.execute_script("return arguments[0].getBBox().width;", svg) > 0
    assert driver.find_element(By.ID, "savings").text.count("$") >= 6
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []

    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1366, min(int(height) + 150, 8000))
    artifacts = REPO / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "reports-placement.png"
    assert driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
