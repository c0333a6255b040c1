"""The chat UI of `python -m dart_jax.serve` (/ui) in a real browser: headless Chromium driven by
Selenium against a live server (the embedded demo model). Every answer the UI shows is checked
against the greedy answer of the same conversation from the server's HTTP API (itself checked
against the model in test_serve_api), so a UI that drops, repeats or mangles text fails.

Needs Debian's `chromium` and `chromium-driver` (CI installs them); without them these tests fail.
"""
from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

from serving import live_server

# one server and one browser for the module: with pytest-xdist (--dist loadgroup) all on one worker
pytestmark = pytest.mark.xdist_group("serve_ui")
NAME = "dart-jax-demo"
TIMEOUT = 60  # seconds for one answer: a prompt of a new length may first compile on a slow CPU
# prompts of the demo model's corpus (it answers those well, and only as a first turn); the side by
# side one fits the prompt shape that the server compiles at warm-up
CODE = "Write a python function that adds two numbers."  # an answer with line breaks and indentation
NEXT = "What is two plus two?"
SIDE = "What is speculative decoding?"  # a long answer: many steps to stream


def _executable(env: str, *names: str) -> str | None:
    """$env if set, else the first of `names` on PATH (or in /usr/bin); None if there is none."""
    if os.environ.get(env):
        return os.environ[env] if Path(os.environ[env]).is_file() else None
    for name in names:
        found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file() else None)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def server():
    with live_server("--demo", "tiny", "--slots", "2", "--max-length", "1024", "--keep", "60") as (url, proc):
        yield url


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        pytest.fail(f"selenium is missing ({e}); install the test extra: pip install -e '.[test]'")
    chromium = _executable("CHROMIUM", "chromium", "chromium-browser")
    driver = _executable("CHROMEDRIVER", "chromedriver")
    if chromium is None or driver is None:
        missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if p is None)
        pytest.fail(f"the UI tests need a headless Chromium and its driver, but {missing} is not on PATH; "
                    "install them with: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                "--window-size=1280,900", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps", "--mute-audio"):
        options.add_argument(arg)
    # the driver's path is given: Selenium Manager (which would go online) is not used
    driver = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def api_answer(url: str, messages: list[dict], max_tokens: int, method: str) -> str:
    body = {"model": NAME, "messages": messages, "temperature": 0, "max_tokens": max_tokens, "method": method}
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
        answer = json.load(r)
    return answer["choices"][0]["message"]["content"]


class Page:
    """The UI in the browser, with what the tests need to read from it and do with it."""

    # the last answers, as the page shows them: each message's visible text and its highlighted spans
    _READ = """
        const panel = document.getElementById(arguments[0]);
        if (!panel) return null;
        const read = (m) => ({text: m.innerText,
                              spans: Array.from(m.querySelectorAll('span.dj-c0, span.dj-c1'))
                                          .map(s => [s.className, s.textContent])});
        return {visible: panel.offsetParent !== null,
                user: Array.from(panel.querySelectorAll('[data-testid=user] .dj-msg')).map(m => m.innerText),
                bot: Array.from(panel.querySelectorAll('[data-testid=bot] .dj-msg')).map(read)};
    """
    # watch the stats' progress tracker: an event has run once it has shown busy, then idle again
    _ARM = """
        const tracker = document.querySelector('#dj-stats [data-testid=status-tracker]');
        window.__dj = {busy: false, done: false, partial: []};
        if (window.__djObserver) window.__djObserver.disconnect();
        const check = () => {
            const idle = tracker.classList.contains('hide');
            if (!idle) window.__dj.busy = true;
            else if (window.__dj.busy) window.__dj.done = true;
            const msgs = document.querySelectorAll('#dj-chat-a [data-testid=bot] .dj-msg');
            const last = msgs.length ? msgs[msgs.length - 1] : null;
            if (last && !window.__dj.done) window.__dj.partial.push(
                [last.textContent.length, last.querySelectorAll('span.dj-c0, span.dj-c1').length]);
        };
        window.__djObserver = new MutationObserver(check);
        window.__djObserver.observe(document.body, {subtree: true, childList: true, attributes: true,
                                                    characterData: true});
    """

    def __init__(self, driver, url: str):
        from selenium.webdriver.support.ui import WebDriverWait
        self.driver, self.url = driver, url
        self.wait = WebDriverWait(driver, TIMEOUT, poll_frequency=0.05)
        driver.get(url + "/ui")
        self.wait.until(lambda d: d.execute_script(
            "const t = document.querySelector('#dj-input textarea');"
            "return !!t && !!document.querySelector('#dj-stats [data-testid=status-tracker]')"))
        self.config = driver.execute_script("return window.gradio_config")

    def default(self, elem_id: str):
        """A component's initial value, as the page was served it."""
        for component in self.config["components"]:
            if component.get("props", {}).get("elem_id") == elem_id:
                return component["props"]["value"]
        raise AssertionError(f"no component #{elem_id} in the page")

    def find(self, css: str):
        from selenium.webdriver.common.by import By
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def read(self, panel: str = "a") -> dict:
        return self.driver.execute_script(self._READ, f"dj-chat-{panel}")

    def stats(self) -> str:
        return self.find("#dj-stats").text

    def run(self, action) -> list:
        """Do `action` (which starts an answer) and wait until the answer has streamed to its end;
        returns the (length, highlighted spans) of the last answer at each update it went through."""
        self.driver.execute_script(self._ARM)
        action()
        try:
            self.wait.until(lambda d: d.execute_script("return window.__dj.done"))
        except Exception:
            raise AssertionError(f"the answer did not finish in {TIMEOUT} s; the page shows {self.read()} "
                                 f"and stats {self.stats()!r}") from None
        return self.driver.execute_script("return window.__dj.partial")

    def send(self, message: str, *, button: bool = False) -> list:
        from selenium.webdriver.common.keys import Keys
        box = self.find("#dj-input textarea")
        box.send_keys(message)
        return self.run(lambda: self.find("#dj-send").click() if button else box.send_keys(Keys.ENTER))

    def choose(self, radio: str, value: str) -> None:
        self.find(f"#{radio} input[value='{value}']").click()
        self.wait.until(lambda d: self.find(f"#{radio} input[value='{value}']").is_selected())


def check_dart(answer: dict, expected: str) -> None:
    """A DART answer: the expected text, all of it in highlighted chunks of alternating colours."""
    assert answer["text"] == expected
    spans = answer["spans"]
    assert len(spans) >= 2, f"the DART answer has no highlighted chunks: {answer}"
    assert "".join(text for _, text in spans) == expected, "text outside the highlighted chunks"
    assert all(cls == f"dj-c{i % 2}" for i, (cls, _) in enumerate(spans)), [cls for cls, _ in spans]


def check_plain(answer: dict, expected: str) -> None:
    assert answer["text"] == expected
    assert answer["spans"] == [], "the plain answer has highlighted chunks"


def tokens_per_s(stats: str) -> float:
    """The tokens/s figure of a stats line ("DART: 71.3 tokens/s · ...")."""
    assert "tokens/s" in stats, stats
    return float(stats.split("tokens/s")[0].split(":")[-1])


@pytest.fixture
def page(browser, server):  # the browser first: without one, fail at once
    return Page(browser, server)


def test_chat_dart_then_plain_regenerate_and_clear(page, server):
    max_new = int(page.default("dj-max-new"))
    assert max_new == 256 and page.default("dj-temperature") == 0 and page.default("dj-method") == "dart"
    one = [{"role": "user", "content": CODE}]
    first = api_answer(server, one, max_new, "dart")
    assert "\n    " in first, first  # the panel must keep its line breaks and indentation

    # DART (Enter): highlighted chunks; tokens/s and mean accepted length
    page.send(CODE)
    view = page.read()
    assert view["user"] == [CODE] and len(view["bot"]) == 1, view
    check_dart(view["bot"][0], first)
    stats = page.stats()
    assert stats.startswith("DART:") and "mean accepted length" in stats, stats
    assert tokens_per_s(stats) > 0, stats
    assert page.find("#dj-input textarea").get_attribute("value") == "", "the textbox was not emptied"

    # plain decoding (Send button), second turn: plain text, the same text as DART's greedy answer
    # of the whole conversation (greedy speculative decoding is lossless)
    two = one + [{"role": "assistant", "content": first}, {"role": "user", "content": NEXT}]
    second = api_answer(server, two, max_new, "dart")
    assert second.strip()
    page.choose("dj-method", "ar")
    page.send(NEXT, button=True)
    view = page.read()
    assert view["user"] == [CODE, NEXT] and len(view["bot"]) == 2, view
    check_dart(view["bot"][0], first)
    check_plain(view["bot"][1], second)
    assert page.stats().startswith("Plain:") and tokens_per_s(page.stats()) > 0, page.stats()

    # Regenerate, back on DART: the last answer is redone from scratch (now highlighted), no third one
    page.choose("dj-method", "dart")
    updates = page.run(lambda: page.find("#dj-regenerate").click())
    assert min(n for n, _ in updates) < len(second), f"the last answer was not redone: {updates}"
    view = page.read()
    assert view["user"] == [CODE, NEXT] and len(view["bot"]) == 2, view
    check_dart(view["bot"][0], first)
    check_dart(view["bot"][1], second)
    assert page.stats().startswith("DART:"), page.stats()

    # Clear: the panel and the stats empty, and the next message starts a new conversation
    page.find("#dj-clear").click()
    page.wait.until(lambda d: page.read()["bot"] == [] and page.read()["user"] == [] and not page.stats().strip())
    page.send(CODE)
    view = page.read()
    assert view["user"] == [CODE] and len(view["bot"]) == 1, view
    check_dart(view["bot"][0], first)


def test_side_by_side(page, server):
    assert not (page.read("b") or {}).get("visible"), "the second panel shows before 'Side by side' is on"
    page.find("#dj-side input[type=checkbox]").click()
    page.wait.until(lambda d: (page.read("b") or {}).get("visible"))
    assert page.default("dj-method-b") == "ar"
    expected = api_answer(server, [{"role": "user", "content": SIDE}], int(page.default("dj-max-new")), "dart")
    updates = page.send(SIDE)
    a, b = page.read("a"), page.read("b")
    assert a["user"] == b["user"] == [SIDE] and len(a["bot"]) == len(b["bot"]) == 1, (a, b)
    check_dart(a["bot"][0], expected)
    check_plain(b["bot"][0], expected)
    assert any(0 < n < len(expected) and spans > 0 for n, spans in updates), \
        f"the DART answer did not stream in highlighted chunks (updates seen: {updates})"
    lines = page.stats().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("DART:") and tokens_per_s(lines[0]) > 0, lines
    assert lines[1].startswith("Plain:") and tokens_per_s(lines[1]) > 0, lines
    assert lines[2].startswith("speedup DART / Plain:") and lines[2].endswith("x"), lines
    speedup = float(lines[2].split(":")[1].strip().rstrip("x"))
    assert speedup == pytest.approx(tokens_per_s(lines[0]) / tokens_per_s(lines[1]), rel=0.05, abs=0.01), lines
