"""The page at `/` in a real browser (headless Chromium through Selenium), against real servers:
SmolLM2-135M with --api-key for the chat, the shared Gemma-3 270M server for the completion box.

Answers shown by the page are checked against the API's greedy answers to the same requests; the
layer strip against `strata inspect --json`; the pool panel against /v1/cache/status.

Without Chromium the tests are skipped, except where the CI variable is set: there they fail.
With STRATA_UI_SCREENSHOTS=DIR the page is saved as DIR/ui-chat.png and DIR/ui-completion.png
(scripts/ui-screenshots.sh writes the ones in docs/).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from conftest import BIN, MODEL, REPO, start_server
from helpers import get, post

SMOL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_KEY = "ui-secret"
SHOTS = os.environ.get("STRATA_UI_SCREENSHOTS")
CANCELLED = 'strata_requests_finished_total{reason="cancelled"}'


def _browser_paths() -> tuple[str | None, str | None]:
    chromium = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
    return chromium, shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = _browser_paths()
    if not (chromium and driver_path):
        reason = ("chromium and chromedriver are needed for the page's browser test "
                  "(apt-get install chromium chromium-driver)")
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI is set, so their absence is an error", pytrace=False)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1180,820", "--hide-scrollbars"):
        opts.add_argument(a)
    driver = webdriver.Chrome(options=opts, service=Service(driver_path))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def smol(log_dir):
    if not SMOL.is_file():
        pytest.skip(f"{SMOL} is absent: run scripts/fetch-models.sh")
    s = start_server(log_dir, "--max-model-len", "2048", "--served-model-name", "smol",
                     name="ui-smol", model=SMOL,
                     api_key=SMOL_KEY)
    yield s
    s.stop()


def wait_for(what: str, check, timeout: float = 30.0, every: float = 0.05):
    """Polls `check` until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def metrics(server) -> dict[str, float]:
    text = requests.get(server.base + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def inspect(model: Path) -> dict:
    out = subprocess.run([str(BIN), "inspect", "--model", str(model), "--json"],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def open_page(driver, server):
    """Loads the page, giving it the server's key when it asks, and waits until it has read
    the model, the layout and the pool once."""
    driver.get(server.base + "/")
    if server.api_key:
        dialog = driver.find_element("id", "key-dialog")
        wait_for("the key dialog", lambda: dialog.get_attribute("open") is not None, 10)
        driver.find_element("id", "key-input").send_keys(server.api_key)
        driver.find_element("id", "key-save").click()
    wait_for("the page to start", lambda: driver.execute_script(
        "return document.body.dataset.ready === 'true'"), 15)


def set_field(driver, id_: str, value: str):
    el = driver.find_element("id", id_)
    el.clear()
    el.send_keys(value)


def shot(driver, name: str):
    if SHOTS:
        time.sleep(1.2)  # one more refresh of the pool panel, after the request
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / name))


def check_layer_strip(driver, model: Path):
    """The strip shows every layer of `model` as `strata inspect` describes it."""
    report = inspect(model)
    shared = {layer: src for layer, src in report["kv_shared_layers"]}
    boxes = driver.find_elements("css selector", "#layer-strip .layer")
    assert len(boxes) == report["num_layers"]
    for i, (box, kind) in enumerate(zip(boxes, report["layer_types"])):
        assert box.get_attribute("data-layer") == str(i)
        assert box.get_attribute("data-attention") == kind.removesuffix("_attention"), i
        assert box.get_attribute("data-owns") == ("false" if i in shared else "true"), i
        assert box.get_attribute("data-source") == str(shared.get(i, i)), i
    assert driver.find_element("id", "kv-cost").text == str(report["kv_cost"])
    assert driver.find_element("id", "kv-cost-unshared").text == str(report["kv_cost_unshared"])


CHAT = "What is the capital of France?"
SYSTEM = "You answer in one short sentence."


def test_chat_streams_the_greedy_answer(browser, smol):
    # The start-up lines name the page beside the curl line.
    assert f"page: {smol.base}/" in smol.log_path.read_text()
    open_page(browser, smol)
    assert browser.find_element("id", "mode-chat").is_selected()
    set_field(browser, "temperature", "0")
    set_field(browser, "max-tokens", "12")
    set_field(browser, "system", SYSTEM)
    set_field(browser, "chat-input", CHAT)
    browser.find_element("id", "send").click()
    body = wait_for("the answer", lambda: browser.find_elements(
        "css selector", ".msg.assistant .body[data-state=done]"))[0]
    shown = body.get_attribute("data-raw")

    r = post(smol, "/v1/chat/completions", {
        "model": smol.model_name, "temperature": 0, "max_tokens": 12,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": CHAT}]})
    assert r.status_code == 200, r.text
    expected = r.json()["choices"][0]["message"]["content"]
    assert expected and shown == expected
    if not re.search(r"[*_`#]|^\s*([-+]|\d+\.)\s", expected, re.M):
        # Plain text renders as itself.
        assert " ".join(body.text.split()) == " ".join(expected.split())
    check_layer_strip(browser, SMOL)
    shot(browser, "ui-chat.png")


def test_stop_cancels_the_request_and_frees_its_pages(browser, smol):
    before = metrics(smol).get(CANCELLED, 0)
    set_field(browser, "temperature", "0.8")
    set_field(browser, "max-tokens", "1500")
    set_field(browser, "chat-input", "Write a very long story about a dragon and a lighthouse.")
    browser.find_element("id", "send").click()
    # The answer streams: text shows while the request still runs.
    body = wait_for("streamed text", lambda: [
        b for b in browser.find_elements("css selector", ".msg.assistant .body[data-state=streaming]")
        if len(b.get_attribute("data-raw") or "") > 0])[0]
    browser.find_element("id", "stop").click()
    wait_for("the stop", lambda: body.get_attribute("data-state") == "stopped", 5)
    wait_for("/metrics to count the cancelled request",
             lambda: metrics(smol).get(CANCELLED, 0) == before + 1, 10)
    status = wait_for("the request's pages to be freed", lambda: (
        lambda s: s if s["running_requests"] == 0 and s["used_pages"] == s["cached_pages"] else None
    )(get(smol, "/v1/cache/status").json()), 10)
    assert status["free_pages"] + status["used_pages"] == status["num_pages"]
    assert not browser.find_element("id", "send").get_attribute("disabled")


def test_pool_panel_shows_cache_status(browser, smol):
    status = get(smol, "/v1/cache/status").json()
    fields = {}

    def panel_matches():
        # Read in one script: the panel redraws its bars every second.
        fields.clear()
        fields.update(browser.execute_script("""
            const out = {};
            for (const el of document.querySelectorAll('#kv [data-field]')) {
                out[el.dataset.field] = el.textContent;
            }
            return out;"""))
        return fields and all(fields[k] == str(status[k]) for k in fields)

    wait_for(f"the panel to show {status}", panel_matches, 5)
    # Every figure the issue names is on the panel.
    assert {"num_pages", "used_pages", "cached_pages", "free_pages", "cache_hits",
            "running_requests", "waiting_requests"} <= set(fields)
    assert status["cache_hits"] >= 1, "the second chat turn reused the first one's prefix"
    width = browser.execute_script(
        "return parseFloat(document.querySelector('.pool[data-pool=full] .seg.cached').style.width)")
    assert width == pytest.approx(100 * status["cached_pages"] / status["num_pages"], abs=1e-3)
    cancelled = metrics(smol)[CANCELLED]
    wait_for("the cancelled count", lambda: browser.find_element(
        "id", "cancelled").text == f"{cancelled:g}", 5)
    assert re.fullmatch(r"\d+\.\d", browser.find_element("id", "decode-rate").text)


HOSTILE = [
    '<script>window.__ui_pwned = 1</script>hello',
    '<img src=x onerror="window.__ui_pwned = 2">',
    '**bold <b>tag</b>** and `<i>code</i>`\n\n```html\n<script>window.__ui_pwned = 3</script>\n```',
    '<a href="javascript:window.__ui_pwned=4">link</a> [md](javascript:alert(1))',
]


def test_markup_in_an_answer_is_shown_as_text(browser, smol):
    # The page's own renderer, on the text a model could send: it creates only its fixed
    # elements (p, strong, code, pre) and the markup shows as text.
    for text in HOSTILE:
        created, shown, pwned = browser.execute_script("""
            const el = document.createElement('div');
            document.body.append(el);
            window.strataUi.showText(el, arguments[0]);
            const tags = [...el.querySelectorAll('*')].map(e => e.tagName.toLowerCase());
            const text = el.textContent;
            return [tags, text, window.__ui_pwned || 0];
        """, text)
        assert set(created) <= {"p", "strong", "em", "code", "pre"}, (text, created)
        assert pwned == 0
        for tag in re.findall(r"<[^>]+>", text):
            assert tag in shown, (tag, shown)
    # The source never hands text to the HTML parser.
    js = requests.get(smol.base + "/ui/app.js", timeout=10).text
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js, sink


def test_completion_box_on_a_base_model(browser, server):
    open_page(browser, server)
    card = requests.get(server.v1 + "/models", timeout=10).json()["data"][0]
    # Gemma-3 GGUFs carry no template; the server falls back to Gemma's turn format, so chat
    # is offered too and the completion box is chosen by hand.
    assert browser.find_element("id", "mode-chat").is_enabled() == card["has_chat_template"]
    browser.find_element("id", "mode-completion").click()
    assert browser.find_element("id", "chat-pane").get_attribute("hidden")
    prompt = "The capital of France is"
    set_field(browser, "completion-prompt", prompt)
    set_field(browser, "temperature", "0")
    set_field(browser, "max-tokens", "8")
    browser.find_element("id", "complete").click()
    out = browser.find_element("id", "completion-output")
    wait_for("the completion", lambda: out.get_attribute("data-state") == "done")
    r = post(server, "/v1/completions", {"model": server.model_name, "prompt": prompt,
                                         "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    expected = r.json()["choices"][0]["text"]
    assert expected and out.get_attribute("data-raw") == expected
    assert " ".join(out.text.split()) == " ".join((prompt + expected).split())
    check_layer_strip(browser, MODEL)
    shot(browser, "ui-completion.png")


def test_no_page_with_ui_off(log_dir):
    # The page is on by default (every test above); --ui off leaves `/` unserved.
    s = start_server(log_dir, "--ui", "off", name="ui-off")
    try:
        assert requests.get(s.base + "/", timeout=10).status_code == 404
        assert requests.get(s.base + "/ui/app.js", timeout=10).status_code == 404
        assert "page: " not in s.log_path.read_text()
    finally:
        s.stop()
