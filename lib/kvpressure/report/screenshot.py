"""Screenshot the report in headless Chromium and check the picture is a real page.

Used by the tests (and by hand) to see ``index.html`` the way a reader's browser draws it at
1280 px, without Jupyter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    """Path of a Chromium binary (``$CHROMIUM`` first), or None."""
    env = os.environ.get("CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def take_screenshot(
    html_path: str | os.PathLike[str],
    png_path: str | os.PathLike[str],
    *,
    width: int = 1280,
    height: int = 2000,
    chromium: str | None = None,
    timeout_s: float = 90.0,
) -> Path:
    """Render ``html_path`` at ``width`` x ``height`` to ``png_path``; returns the PNG path.

    Raises FileNotFoundError without Chromium, RuntimeError when it fails or writes nothing.
    """
    binary = chromium or find_chromium()
    if binary is None:
        raise FileNotFoundError("chromium not found (install Debian's `chromium`)")
    html_path = Path(html_path).resolve()
    png_path = Path(png_path).resolve()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    if png_path.exists():
        png_path.unlink()
    with tempfile.TemporaryDirectory(prefix="kvpressure-chromium-") as profile:
        cmd = [
            binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
            f"--window-size={width},{height}", f"--screenshot={png_path}",
            html_path.as_uri(),
        ]
        env = {**os.environ, "HOME": profile}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    if proc.returncode != 0 or not png_path.is_file():
        tail = (proc.stderr or "").strip().splitlines()[-5:]
        raise RuntimeError(
            f"chromium exited {proc.returncode} without a screenshot: " + " | ".join(tail)
        )
    return png_path


@dataclass(frozen=True)
class ScreenshotCheck:
    width: int
    height: int
    distinct_colours: int
    non_white_fraction: float

    def problems(self, width: int = 1280, min_colours: int = 64, min_ink: float = 0.02) -> list[str]:
        """Why the picture is not a drawn page (empty list: it is one)."""
        out = []
        if self.width != width:
            out.append(f"width is {self.width} px, expected {width}")
        if self.distinct_colours < min_colours:
            out.append(f"only {self.distinct_colours} distinct colours (blank or failed page?)")
        if self.non_white_fraction < min_ink:
            out.append(f"only {self.non_white_fraction:.1%} of the pixels are not white")
        return out


def check_screenshot(png_path: str | os.PathLike[str]) -> ScreenshotCheck:
    """Size, number of distinct colours and non-white fraction of a PNG."""
    import numpy as np
    from PIL import Image

    with Image.open(png_path) as image:
        rgb = np.asarray(image.convert("RGB"))
    height, width, _ = rgb.shape
    packed = (rgb[..., 0].astype(np.uint32) << 16) | (rgb[..., 1].astype(np.uint32) << 8) | rgb[
        ..., 2
    ]
    distinct = int(np.unique(packed).size)
    non_white = float(np.mean(np.any(rgb < 245, axis=-1)))
    return ScreenshotCheck(width, height, distinct, non_white)


def find_chromedriver() -> str | None:
    """Path of the driver for Chromium (``$CHROMEDRIVER`` first; Debian's ``chromium-driver``)."""
    env = os.environ.get("CHROMEDRIVER")
    if env and Path(env).is_file():
        return env
    found = shutil.which("chromedriver")
    if found:
        return found
    debian = Path("/usr/lib/chromium/chromedriver")
    return str(debian) if debian.is_file() else None


def chromium_driver(width: int = 1280, height: int = 900) -> Any:
    """A Selenium driver for headless Chromium with a ``width`` x ``height`` viewport (the
    local binary and driver: nothing is downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = find_chromium(), find_chromedriver()
    if binary is None or driver is None:
        raise FileNotFoundError("chromium or chromedriver not found (install Debian's "
                                "`chromium` and `chromium-driver`)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def page_layout(html_path: str | os.PathLike[str], selectors: dict[str, str], *,
                width: int = 1280, height: int = 900,
                png_path: str | os.PathLike[str] | None = None) -> dict[str, dict[str, Any]]:
    """Where the first element of each CSS selector sits on the page drawn at ``width`` px:
    ``top``/``bottom``/``left``/``right`` in page pixels and its ``text`` (None when absent);
    the first screen is also saved to ``png_path`` when given."""
    driver = chromium_driver(width, height)
    try:
        driver.get(Path(html_path).resolve().as_uri())
        out: dict[str, dict[str, Any]] = {}
        for name, selector in selectors.items():
            out[name] = driver.execute_script(
                "const e = document.querySelector(arguments[0]); if (!e) return null;"
                "const r = e.getBoundingClientRect();"
                "return {top: r.top + window.scrollY, bottom: r.bottom + window.scrollY,"
                " left: r.left, right: r.right, text: e.innerText};", selector)
        if png_path is not None:
            driver.save_screenshot(str(png_path))
        return out
    finally:
        driver.quit()
