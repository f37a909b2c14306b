"""The report as a person sees it: headless Chromium renders the page and the charts show.
Skips cleanly where no Chromium is installed (Debian: apt-get install chromium)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import SPECS
from specgen.cli import main

BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome", "chrome")
                if shutil.which(name)), None)


@pytest.mark.skipif(BROWSER is None, reason="needs a headless Chromium (apt-get install chromium)")
def test_headless_chromium_screenshot_shows_the_charts(tmp_path):
    image = pytest.importorskip("PIL.Image")
    page = tmp_path / "report.html"
    assert main(["report", str(SPECS), "-o", str(page), "--no-history"]) == 0
    shot = tmp_path / "report.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=False, cwd=tmp_path)
    assert shot.is_file() and shot.stat().st_size > 20_000
    pixels = image.open(shot).convert("RGB")
    assert pixels.size == (1200, 2400)
    colors = pixels.getcolors(maxcolors=1 << 20)
    count = {color: n for n, color in colors}
    kernel_orange = sum(n for (r, g, b), n in count.items() if r > 200 and 70 < g < 110 and b < 40)
    compile_blue = sum(n for (r, g, b), n in count.items() if r < 110 and 120 < g < 160 and b > 220)
    assert kernel_orange > 500 and compile_blue > 500  # the bars and points of the SVG charts rendered
    assert len(colors) > 50  # text, tables and charts: not a blank or error page
