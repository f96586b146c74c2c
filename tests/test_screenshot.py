"""The report drawn by headless Chromium at 1280 px: a real page, not a blank one."""

from __future__ import annotations

import io
import os

import nbformat
import numpy as np
import pytest

from kvpressure.record.io import validate_record
from kvpressure.report.html import build_html
from kvpressure.report.screenshot import check_screenshot, find_chromium, take_screenshot
from report_helpers import valid_record

pytestmark = pytest.mark.browser

CHROMIUM = find_chromium()
if CHROMIUM is None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError("CI is set but chromium is not installed (apt-get install chromium)")
    pytest.skip("chromium not installed (apt-get install chromium); CI unset, so skipped",
                allow_module_level=True)


def _figure_png() -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    x = np.array([8, 16, 24, 32, 48, 64])
    ax.plot(x, [300, 520, 610, 640, 560, 480], marker="o")
    ax.set(xlabel="concurrency", ylabel="output tokens/s")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _notebook() -> nbformat.NotebookNode:
    import base64

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("show_figure(fig)")
    cell.outputs = [nbformat.v4.new_output(
        "display_data", data={"image/png": base64.b64encode(_figure_png()).decode()})]
    nb.cells = [nbformat.v4.new_markdown_cell("# 03 · The knee"), cell]
    return nb


@pytest.fixture(scope="module")
def shot(tmp_path_factory):
    out = tmp_path_factory.mktemp("shot")
    page = build_html(validate_record(valid_record()), [("03_knee", _notebook())], "seed case")
    html = out / "index.html"
    html.write_text(page, encoding="utf-8")
    return take_screenshot(html, out / "index.png", width=1280, height=1600)


def test_report_screenshot_is_a_drawn_page_1280_wide(shot):
    check = check_screenshot(shot)
    assert check.width == 1280 and check.height == 1600
    assert check.problems() == []


def test_check_flags_a_blank_page(tmp_path):
    html = tmp_path / "blank.html"
    html.write_text("<!DOCTYPE html><html><body></body></html>")
    check = check_screenshot(take_screenshot(html, tmp_path / "blank.png", height=600))
    assert check.distinct_colours <= 2
    assert any("distinct colours" in p for p in check.problems())
    assert any("not white" in p for p in check.problems())
