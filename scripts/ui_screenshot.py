"""Screenshot of the chat UI after a side-by-side answer (DART next to plain decoding), for the docs.

    python scripts/ui_screenshot.py                      # starts the demo server, writes docs/serve_ui.png
    python scripts/ui_screenshot.py --url http://127.0.0.1:8000 --out /tmp/ui.png

Needs headless Chromium and its driver (Debian: apt-get install chromium chromium-driver) and the
test extra (selenium). Offline: the driver's path is given, so Selenium Manager is not used.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "What is speculative decoding?"


def screenshot(url: str, out: Path, width: int = 1280, height: int = 900) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        sys.exit("error: needs chromium and chromedriver on PATH (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                f"--window-size={width},{height}", "--hide-scrollbars", "--disable-background-networking"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        wait = WebDriverWait(driver, 120, poll_frequency=0.1)
        driver.get(url.rstrip("/") + "/ui")
        box = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#dj-input textarea"))
        driver.find_element(By.CSS_SELECTOR, "#dj-side input[type=checkbox]").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#dj-chat-b"))
        box.send_keys(PROMPT)
        box.send_keys(Keys.ENTER)
        # done: both panels answered and the stats show the speedup, with no progress shown any more
        wait.until(lambda d: "speedup" in d.find_element(By.ID, "dj-stats").text and d.execute_script(
            "return document.querySelector('#dj-stats [data-testid=status-tracker]').classList.contains('hide')"
            " && document.querySelectorAll('#dj-chat-b [data-testid=bot] .dj-msg').length === 1"))
        driver.execute_script("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
        png = driver.get_screenshot_as_png()
    finally:
        driver.quit()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:  # a smaller file: the UI has few colours
        from PIL import Image
        image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        buf = io.BytesIO()
        image.save(buf, "PNG", optimize=True)
        png = buf.getvalue()
    except ImportError:
        pass
    out.write_bytes(png)
    print(f"wrote {out} ({len(png) // 1024} KiB)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start the demo server on a free port)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "serve_ui.png")
    args = ap.parse_args(argv)
    if args.url:
        screenshot(args.url, args.out)
        return 0
    sys.path.insert(0, str(ROOT / "tests"))
    from serving import live_server
    with live_server() as (url, _):
        screenshot(url, args.out)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
