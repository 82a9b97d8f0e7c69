"""The browser playground (``serve/playground``, ``GET /playground/``) against the running application.

Its files are served without a key and reach for nothing outside the server; a browser's key rides
on a WebSocket subprotocol. Then, in headless Chromium (the system's, through Playwright; ``make
test`` installs it where it can, and the tests are skipped where there is none), against the app
``tests/serve/test_security.py`` uses (``tests.serve.conftest.SecureApp``: TLS, the fast lane at
tp=2 x pp=2 on four chips, so it has hops to draw): the page races every tier the server lists and
each pane streams the text the SDK returns for the same greedy request, the fast pane draws the
chip-to-chip hops the SDK's response reports, cancel stops a stream, and a wrong key, bad input and
an overloaded lane each show their error in the panes. The race's screenshot is saved (to
``$PLAYGROUND_SCREENSHOT``, else the test's temporary directory: ``docs/playground.png`` came from
``PLAYGROUND_SCREENSHOT=docs/playground.png``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from clients.sdk import Client
from serve.auth import KEY_SUBPROTOCOL
from serve.protocol import VERSION

# a browser against the shared app, minutes a file: the full suite only (make test-all)
pytestmark = pytest.mark.full

PLAYGROUND = Path(__file__).resolve().parents[2] / "serve" / "playground"
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
PROMPT = "def parse(path):\n"
TIERS = {"fast": ("fastmode-fast", None), "exact": ("fastmode-full", "exact"),
         "priority": ("fastmode-full", "priority"), "standard": ("fastmode-full", "default"), "auto": ("auto", None)}
ENDED = "['completed', 'cancelled', 'error'].includes"


def key_protocol(key: str) -> str:
    return KEY_SUBPROTOCOL + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def test_the_pages_files_name_nothing_outside_the_server():
    files = {p.name: p.read_text() for p in PLAYGROUND.iterdir()}
    assert set(files) == {"index.html", "app.js", "style.css"}
    for name, text in files.items():
        assert not re.search(r"(https?:)?//[\w.-]+\.\w", text), f"{name} names an outside URL"
    assert 'src="app.js"' in files["index.html"] and 'href="style.css"' in files["index.html"]
    # The page offers the key the way serve.auth reads it.
    assert f'KEY_SUBPROTOCOL = "{KEY_SUBPROTOCOL}"' in files["app.js"] and f'"{VERSION}"' in files["app.js"]


@pytest.mark.slow
def test_the_page_is_served_without_a_key_and_the_api_still_needs_one(app):
    a = app()
    with httpx.Client(base_url=a.base, timeout=30) as anonymous:
        r = anonymous.get("/")
        assert r.status_code == 307 and r.headers["location"] == "/playground/"
        for path, name, kind in (("/playground/", "index.html", "text/html"), ("/playground/app.js", "app.js",
                                  "javascript"), ("/playground/style.css", "style.css", "text/css")):
            r = anonymous.get(path)
            assert r.status_code == 200 and kind in r.headers["content-type"], (path, r.headers)
            assert r.text == (PLAYGROUND / name).read_text()
        assert anonymous.get("/playground/nope.js").status_code == 404
        assert anonymous.get("/v1/models").status_code == 401
    assert f"  page     {a.base}/playground/" in "".join(a.output)


@pytest.mark.slow
def test_a_browser_may_send_the_key_as_a_subprotocol(app):
    a = app()

    async def main(key: str) -> tuple[str | None, list[dict]]:
        async with connect(a.ws_url, subprotocols=[VERSION, key_protocol(key)]) as conn:
            await conn.send('{"type": "response.create", "id": "r", "model": "fastmode-fast", "input": "x", '
                            '"max_output_tokens": 4, "temperature": 0}')
            events = []
            while not events or events[-1]["type"] not in ("response.completed", "error"):
                events.append(json.loads(await conn.recv()))
            return conn.subprotocol, events

    selected, events = asyncio.run(main(a.key))
    assert selected == VERSION  # the key is never echoed back
    assert events[-1]["type"] == "response.completed" and events[-1]["usage"]["output_tokens"] == 4
    assert sum(e.get("tokens", 0) for e in events if e["type"] == "response.output_text.delta") == 4
    with pytest.raises(ConnectionClosed) as closed:
        asyncio.run(main("sk-wrong"))
    assert closed.value.rcvd.code == 1008


# -- in a real browser ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; make test-all installs it: docs/operating.md#tests)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


@pytest.fixture
def ring_app(browser, secure_app):
    """The secure app (``tests.serve.conftest.SecureApp``), whose fast lane is a ring of four chips,
    reached over TLS: started only where a browser is (hence ``browser`` first), and run among that
    app's other tests (``tests/conftest.py`` orders them), so no app is started for these alone."""
    return secure_app.app


def sdk_client(a) -> Client:
    return Client(a.base.replace("http", "ws", 1), api_key=a.key, ca_file=str(a.ca_file) if a.ca_file else None)


def open_page(browser, a):
    """The playground, the key typed in (the server asks for one), every tier listed and ticked."""
    # The app's certificate is self-signed: the page's context accepts it, as a browser told to trust it would.
    page = browser.new_page(viewport={"width": 1600, "height": 1000}, ignore_https_errors=bool(a.ca_file))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors  # uncaught exceptions in the page's script
    page.goto(a.base + "/")
    page.wait_for_selector("#key-row:not([hidden])")  # the server has keys: the page asks for one
    assert "needs an API key" in page.text_content("#key-status")
    page.fill("#api-key", a.key)
    page.dispatch_event("#api-key", "change")
    page.wait_for_selector("#pane-auto")
    return page


def race(page, *, tiers=None, prompt=PROMPT, max_tokens="32", temperature="0", fixed=False) -> None:
    page.fill("#prompt", prompt)
    page.fill("#max-tokens", max_tokens)
    page.fill("#temperature", temperature)
    page.set_checked("#ignore-eos", fixed)
    for box in page.query_selector_all("#tiers input"):
        box.set_checked(tiers is None or box.get_attribute("id").removeprefix("tier-") in tiers)
    page.click("#race")


def wait_ended(page, tiers, timeout_s: float = 240) -> None:
    sel = ",".join(f"#pane-{t}" for t in tiers)
    page.wait_for_function(f"() => [...document.querySelectorAll('{sel}')].every(p => {ENDED}(p.dataset.state))",
                           timeout=timeout_s * 1000)


def pane(page, tier: str) -> dict[str, str]:
    return page.eval_on_selector(f"#pane-{tier}", """p => ({
        state: p.dataset.state, lane: p.dataset.lane || null, route: p.querySelector('.route').textContent,
        text: p.querySelector('.text').textContent, error: p.querySelector('.error').hidden ? null
            : p.querySelector('.error').textContent,
        hops: p.querySelector('.hops').hidden ? null : [...p.querySelectorAll('.hops tr')].map(
            r => [...r.cells].map(c => c.textContent)),
        hops_caption: p.querySelector('.hops figcaption').textContent,
        ...Object.fromEntries([...p.querySelectorAll('dd')].map(d => [d.dataset.field, d.textContent]))})""")


@pytest.mark.slow
def test_every_tier_races_and_streams_what_the_sdk_returns(ring_app, browser, tmp_path):
    a = ring_app
    page = open_page(browser, a)
    listed = page.eval_on_selector_all("#tiers input", "bs => bs.map(b => b.id.slice(5))")
    assert listed == ["fast", "exact", "priority", "standard", "auto"]  # what GET /v1/models lists, in that order
    race(page)
    wait_ended(page, TIERS)
    shot = Path(os.environ.get("PLAYGROUND_SCREENSHOT") or tmp_path / "playground.png")
    page.screenshot(path=shot, full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with sdk_client(a) as sdk:
        for tier, (model, service_tier) in TIERS.items():
            ref = sdk.responses.create(model=model, service_tier=service_tier, input=PROMPT, max_output_tokens=32,
                                       temperature=0)
            if tier == "fast":
                fast_ref = ref
            got = pane(page, tier)
            assert got["state"] == "completed", got
            assert got["text"] == ref.text and got["text"], (tier, got["text"], ref.text)
            assert got["lane"] == ref.lane and got["finish"] == ref.finish_reason
            assert got["tokens"] == str(ref.usage.output_tokens)
            assert float(got["cost"]) == pytest.approx(ref.cost_units, rel=1e-2)
            assert re.fullmatch(r"[\d.]+ ms server · [\d.]+ ms browser", got["ttft"]), got["ttft"]
            assert float(got["tps"]) > 0
            if tier == "auto":
                route = ref.route
                assert got["route"].startswith(f"auto chose {ref.lane} ") and \
                    f"difficulty {route['difficulty']} " in got["route"] and \
                    f"threshold {route['threshold']}" in got["route"], got["route"]
    assert not page.errors

    # The fast pane's heatmap: one row and column per chip, µs per hop where the ring hands a step on,
    # for the chip pairs the SDK's response to the same request reports.
    assert a.lane_stats("fast")["layout"] == {"tp": 2, "pp": 2, "why": "set in the config"}
    fast = pane(page, "fast")
    chips = fast["hops"][0][1:]
    assert len(chips) == 4 and all(len(row) == 5 for row in fast["hops"]), fast["hops"]
    cells = {(row[0], chips[j]): c for row in fast["hops"][1:] for j, c in enumerate(row[1:]) if c}
    chip = lambda name: name.split("/")[-1]  # noqa: E731 - one node: the page labels a chip by its name alone
    assert set(cells) == {(chip(h["src"]), chip(h["dst"])) for h in fast_ref.hops}, (cells, fast_ref.hops)
    # head -> its TP peer, stage 0 -> stage 1 (each rank), stage 1 (each rank) -> head
    assert len(cells) == 5 and all(float(c) > 0 for c in cells.values()), cells
    # Every step of the response crossed each pair once: its prefill and a decode step per token after.
    assert {h["count"] for h in fast_ref.hops} == {int(fast["tokens"])}, fast_ref.hops
    assert fast["hops_caption"].startswith(f"chip-to-chip hops: {5 * int(fast['tokens'])},"), fast


@pytest.mark.slow
def test_cancel_stops_a_stream(ring_app, browser):
    a = ring_app
    page = open_page(browser, a)
    race(page, tiers={"standard"}, max_tokens="480", temperature="1", fixed=True)
    page.wait_for_function("() => document.querySelector('#pane-standard .text').textContent.length > 0",
                           timeout=120_000)
    with a.paused("standard") as standard:  # the stream cannot end before the cancel reaches the lane
        page.click("#cancel")
        wait_ended(page, ["standard"], timeout_s=30)
        standard.reached_engine()
    got = pane(page, "standard")
    assert got["state"] == "cancelled", got
    time.sleep(1.0)
    assert pane(page, "standard")["text"] == got["text"]  # nothing more arrived
    assert 0 < int(got["tokens"]) < 480 and got["finish"] == "-"
    for _ in range(50):  # the lane freed the sequence
        if a.lane_stats("standard")["running"] == 0:
            break
        time.sleep(0.1)
    assert a.lane_stats("standard")["running"] == 0
    assert page.is_disabled("#cancel")


@pytest.mark.slow
def test_a_wrong_key_shows_the_error_in_every_pane(ring_app, browser):
    a = ring_app
    page = open_page(browser, a)
    page.fill("#api-key", "sk-wrong")
    page.dispatch_event("#api-key", "change")
    page.wait_for_function("() => document.querySelector('#key-status').textContent.includes('wrong API key')")
    race(page)
    wait_ended(page, TIERS, timeout_s=30)
    for tier in TIERS:
        got = pane(page, tier)
        assert got["state"] == "error" and "wrong API key" in got["error"] and "1008" in got["error"], got
    assert page.text_content("#connection").startswith("closed: unauthorized")


@pytest.mark.slow
def test_bad_input_shows_the_servers_error_in_each_pane(ring_app, browser):
    a = ring_app
    page = open_page(browser, a)
    race(page, temperature="5")
    wait_ended(page, TIERS, timeout_s=60)
    for tier in TIERS:
        got = pane(page, tier)
        assert got["state"] == "error" and got["error"].startswith("invalid_request: ") and \
            "temperature" in got["error"], got
    race(page, max_tokens="100000")  # within the protocol, beyond every model's context
    wait_ended(page, TIERS, timeout_s=60)
    for tier in TIERS:
        got = pane(page, tier)
        assert got["state"] == "error" and got["error"].startswith("prompt_too_long: "), got


@pytest.mark.slow
def test_an_overloaded_lane_shows_retry_after(ring_app, browser):
    a = ring_app
    page = open_page(browser, a)
    with sdk_client(a) as sdk:
        cap = a.lane_stats("priority")["cap"]
        holders = [sdk.responses.stream(model="fastmode-full", service_tier="priority", input=PROMPT,
                                        max_output_tokens=480, ignore_eos=True) for _ in range(cap)]
        texts = [iter(h) for h in holders]
        try:
            for t in texts:  # each holds a slot of the lane once its first text has arrived
                next(t)
            with a.paused("priority"):  # and none can end, giving its slot back, while the page asks
                race(page, tiers={"priority"})
                wait_ended(page, ["priority"], timeout_s=60)
        finally:
            for h in holders:
                if not h.done:
                    h.cancel()
    got = pane(page, "priority")
    assert got["state"] == "error" and got["error"].startswith("overloaded: "), got
    assert re.search(r"\(retry after [\d.]+ s\)$", got["error"]), got["error"]
