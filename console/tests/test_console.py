"""The operator console in a real browser against the real stack (conftest.py): signing in,
the two workers on Fleet, finding an instance by prefix and opening its row, cordoning a worker
and undraining it, winding an instance down, pausing one and resuming it, a refusal for an
out-of-scope credential, the charts drawn, hostile values shown as text, and the console on
the metrics listener.

`CONSOLE_SCREENSHOT=docs/console.png` makes the Fleet test write the README's screenshot."""

from __future__ import annotations

import os
import re
import time

import pytest
from conftest import HOSTILE_ID, HOSTILE_TAG, Console, Stack, support
from playwright.sync_api import Page, expect

# A refresh is 2 s; a few of them.
REFRESH_MS = 7000


def sign_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/_console/")
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#nav")).to_be_visible()


@pytest.fixture
def page(console: Console, stack: Stack) -> Page:
    """The console on the main listener, signed in with the unrestricted credential."""
    sign_in(console.page, stack.node.url, stack.operator)
    return console.page


def search(
    page: Page,
    ns: str = "/threads",
    prefix: str = "",
    tag: str = "",
    limit: str = "100",
) -> None:
    """The Instances page's search, filled in and sent."""
    page.click("nav a[data-page=instances]")
    page.fill("#search input[name=ns]", ns)
    page.fill("#search input[name=prefix]", prefix)
    page.fill("#search input[name=tag]", tag)
    page.select_option("#search select[name=limit]", limit)
    page.click("#search button[type=submit]")


def worker_row(page: Page, client: str):  # type: ignore[no-untyped-def]
    return page.locator("#workers tbody tr").filter(
        has=page.locator("td.client", has_text=re.compile(f"^{client}$"))
    )


def no_page_errors(console: Console) -> None:
    assert console.errors == [], console.errors
    violations = [m for m in console.messages if "Content Security Policy" in m]
    assert violations == [], violations


def test_sign_in_and_see_two_workers(console: Console, stack: Stack) -> None:
    page = console.page
    page.goto(f"{stack.node.url}/_console")
    expect(page).to_have_url(f"{stack.node.url}/_console/")
    page.fill("#token", "not-a-credential")
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#sign-in-error")).to_have_text("401 unauthorized")
    expect(page.locator("#nav")).to_be_hidden()

    sign_in(page, stack.node.url, stack.operator)
    expect(page.locator("#who")).to_contain_text("ops")
    rows = page.locator("#workers tbody tr")
    expect(rows).to_have_count(2)
    for client, worker in stack.workers.items():
        row = worker_row(page, client)
        expect(row.locator("td.state")).to_have_text("serving")
        expect(row.locator("td.namespaces")).to_have_text("/docs, /threads")
        assert row.locator("td.client").get_attribute("title") == worker.session
    expect(page.locator("#health-serving")).to_have_text("yes")
    expect(page.locator("#health-license")).to_have_text(
        "held by this node's fleet, epoch 0"
    )
    # The console's own calls came by HTTP/1.1 (Chromium speaks no h2c).
    expect(page.locator("#health-protocols")).to_contain_text("HTTP/1.1")
    # The resolution rates need two polls.
    expect(
        page.locator("#resolutions tbody tr[data-key=forward] td").nth(1)
    ).not_to_have_text("")
    # Reloaded, the tab keeps its credential (sessionStorage), no sign-in again.
    page.reload()
    expect(page.locator("#workers tbody tr")).to_have_count(2)
    shot = os.environ.get("CONSOLE_SCREENSHOT")
    if shot:
        # Steady traffic for a few refreshes, so that the rates are not all zero.
        deadline = time.monotonic() + 5
        i = 0
        while time.monotonic() < deadline:
            stack.node.get(f"/threads/inst-{i % 12}/hello")
            i += 1
            time.sleep(0.02)
        page.screenshot(path=shot)
    no_page_errors(console)


def test_find_an_instance_by_prefix_and_open_its_row(
    console: Console, stack: Stack, page: Page
) -> None:
    search(page, prefix="inst-1")
    rows = page.locator("#instances tbody tr")
    # inst-1, inst-10, inst-11: one page holds them all.
    expect(rows).to_have_count(3)
    assert sorted(rows.locator("td.id").all_inner_texts()) == [
        "inst-1",
        "inst-10",
        "inst-11",
    ]
    expect(page.locator("#search-status")).to_contain_text("the last page")
    expect(page.locator("#next-page")).to_be_hidden()

    page.locator("#instances td.id button", has_text=re.compile("^inst-10$")).click()
    fields = page.locator("#instance-fields")
    expect(fields.locator("[data-field=epoch]")).to_have_text(
        stack.epoch_of("/threads", "inst-10")
    )
    owner = stack.redis.row("/threads", "inst-10")
    assert owner is not None
    expect(fields.locator("[data-field='owner session']")).to_have_text(
        owner["sessionId"]
    )
    expect(fields.locator("[data-field='wind-down deadline']")).to_have_text("none")
    # Its ownership history: the one placement, to its owner.
    history = page.locator("#instance-history")
    expect(history).to_be_visible()
    entries = history.locator("tbody tr")
    expect(entries).to_have_count(1)
    expect(entries.first.locator("td").nth(3)).to_have_text(owner["sessionId"])
    expect(entries.first.locator("td").nth(4)).to_have_text("placed")
    no_page_errors(console)


def test_pages_of_a_small_limit_cover_every_instance_once(
    console: Console, stack: Stack, page: Page
) -> None:
    search(page, prefix="inst-", limit="50")
    expect(page.locator("#search-status")).to_contain_text("page 1")
    seen = page.locator("#instances td.id").all_inner_texts()
    while page.locator("#next-page").is_visible():
        before = page.locator("#search-status").inner_text()
        page.click("#next-page")
        expect(page.locator("#search-status")).not_to_have_text(before)
        seen += page.locator("#instances td.id").all_inner_texts()
    assert sorted(seen) == sorted(f"inst-{i}" for i in range(12))


def test_cordon_a_worker_then_undrain_it(
    console: Console, stack: Stack, page: Page
) -> None:
    row = worker_row(page, "worker-a")
    expect(row.locator("td.state")).to_have_text("serving")
    row.locator("button.cordon").click()
    dialog = page.locator("#confirm")
    expect(dialog).to_be_visible()
    expect(page.locator("#confirm-says")).to_contain_text("Cordon worker worker-a")
    page.click("#confirm-go")
    expect(dialog).to_be_hidden()
    expect(row.locator("td.state")).to_have_text("cordoned", timeout=REFRESH_MS)
    expect(row).to_have_class(re.compile("cordoned"))
    expect(worker_row(page, "worker-b").locator("td.state")).to_have_text("serving")

    row.locator("button.undrain").click()
    expect(page.locator("#confirm-says")).to_contain_text(
        "Lift the operator drain of worker worker-a"
    )
    page.click("#confirm-go")
    expect(row.locator("td.state")).to_have_text("serving", timeout=REFRESH_MS)
    page.click("nav a[data-page=actions]")
    results = page.locator("#results li")
    expect(results.nth(0)).to_contain_text('Undrain worker-a: {"revoked":true}')
    expect(results.nth(1)).to_contain_text('Cordon worker-a: {"drained":true}')
    no_page_errors(console)


def test_wind_down_an_instance(console: Console, stack: Stack, page: Page) -> None:
    search(page, prefix="inst-5")
    page.locator("#instances td.id button", has_text="inst-5").click()
    deadline = page.locator("#instance-fields [data-field='wind-down deadline']")
    expect(deadline).to_have_text("none")
    page.click("#instance-wind-down")
    expect(page.locator("#confirm-says")).to_contain_text(
        "Wind down instance /threads/inst-5"
    )
    page.click("#confirm-go")
    expect(deadline).to_contain_text("(in ")
    row = stack.redis.row("/threads", "inst-5")
    assert row is not None and row["expiry"] > time.time() * 1000, row
    page.click("nav a[data-page=actions]")
    expect(page.locator("#results li").first).to_contain_text(
        'Wind down /threads/inst-5: {"queued":true}'
    )
    no_page_errors(console)


def test_pause_an_instance_then_resume_it(
    console: Console, stack: Stack, page: Page
) -> None:
    epoch = stack.epoch_of("/threads", "inst-7")
    search(page, prefix="inst-7")
    page.locator("#instances td.id button", has_text="inst-7").click()
    paused = page.locator("#instance-fields [data-field=paused]")
    expect(paused).to_have_text("no")
    expect(page.locator("#instance-resume")).to_be_hidden()
    page.click("#instance-pause")
    expect(page.locator("#confirm-says")).to_contain_text(
        'Pause instance /threads/inst-7: every node answers its requests 503 "instance paused"'
    )
    page.click("#confirm-go")
    expect(paused).to_contain_text("by ops")
    expect(page.locator("#instance-resume")).to_be_visible()
    expect(page.locator("#instance-pause")).to_be_hidden()
    # The data plane refuses it; the owner keeps it.
    refused = stack.node.get("/threads/inst-7/hello")
    assert refused.status_code == 503, refused.text
    assert refused.json() == {"error": "instance paused"}
    assert refused.headers["retry-after"] == "1"
    row = stack.redis.row("/threads", "inst-7")
    assert row is not None and row["epoch"] == epoch and row["paused"]["by"] == "ops", (
        row
    )
    # The listing's badge.
    search(page, prefix="inst-7")
    badge = page.locator("#instances tbody tr td.paused .badge")
    expect(badge).to_have_text("paused")

    # Resumed from the Actions page: served again, at the same epoch, no badge.
    page.click("nav a[data-page=actions]")
    form = page.locator("#pause-form")
    form.locator("input[name=namespace]").fill("/threads")
    form.locator("input[name=id]").fill("inst-7")
    form.locator("button[value=resume]").click()
    expect(page.locator("#confirm-says")).to_contain_text(
        "Resume instance /threads/inst-7"
    )
    page.click("#confirm-go")
    expect(page.locator("#results li").first).to_contain_text(
        'Resume /threads/inst-7: {"ok":true}'
    )
    served = stack.node.get("/threads/inst-7/hello")
    assert served.status_code == 200, served.text
    assert stack.epoch_of("/threads", "inst-7") == epoch
    search(page, prefix="inst-7")
    expect(page.locator("#instances tbody tr")).to_have_count(1)
    expect(badge).to_have_count(0)
    no_page_errors(console)


def test_an_out_of_scope_credential_sees_the_nodes_refusals(
    console: Console, stack: Stack
) -> None:
    page = console.page
    sign_in(page, stack.node.url, stack.scoped)
    expect(page.locator("#who")).to_contain_text("namespaces /other")
    expect(page.locator("#worker-count")).to_have_text("0 live")
    expect(page.locator("#workers tbody tr")).to_have_count(0)

    page.click("nav a[data-page=actions]")
    form = page.locator("#wind-down-form")
    form.locator("input[name=namespace]").fill("/threads")
    form.locator("input[name=id]").fill("inst-3")
    form.locator("button[type=submit]").click()
    page.click("#confirm-go")
    expect(page.locator("#confirm-outcome")).to_have_text(
        "Refused: 403 namespace not allowed: /threads"
    )
    page.click("#confirm-cancel")
    drain = page.locator("#drain-form")
    drain.locator("input[name=clientId]").fill("worker-b")
    drain.locator("button[type=submit]").click()
    page.click("#confirm-go")
    expect(page.locator("#confirm-outcome")).to_have_text("Refused: 403 forbidden")
    page.click("#confirm-cancel")
    results = page.locator("#results li")
    expect(results.nth(0)).to_contain_text("Cordon worker-b: refused: 403 forbidden")
    expect(results.nth(1)).to_contain_text(
        "Wind down /threads/inst-3: refused: 403 namespace not allowed: /threads"
    )
    row = stack.redis.row("/threads", "inst-3")
    assert row is not None and "expiry" not in row, row

    page.click("nav a[data-page=charts]")
    expect(page.locator("#charts-error")).to_contain_text("(403 forbidden)")
    no_page_errors(console)


def test_the_charts_draw_from_metrics(
    console: Console, stack: Stack, page: Page
) -> None:
    page.click("nav a[data-page=charts]")
    # Traffic across a few samples, a new placement among it.
    for i in range(6):
        stack.node.get(f"/threads/inst-{i}/hello")
        stack.node.get(f"/docs/chart-{i}/hello")
        page.wait_for_timeout(700)
    for chart in ("requests", "latency", "placements"):
        path = page.locator(f"#chart-{chart} path.line").first
        expect(path).to_have_attribute("d", re.compile(r"^M[\d.]+,[\d.]+L"))
    expect(page.locator("#chart-requests text.legend").first).to_contain_text("2xx")
    expect(page.locator("#charts-error")).to_have_text("")
    no_page_errors(console)


def test_hostile_values_are_shown_as_text(
    console: Console, stack: Stack, page: Page
) -> None:
    search(page, tag=HOSTILE_TAG)
    rows = page.locator("#instances tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.locator("td.tag")).to_have_text(HOSTILE_TAG)
    expect(rows.locator("td.id")).to_have_text("inst-0")

    search(page, prefix="<img")
    expect(rows).to_have_count(1)
    expect(rows.locator("td.id")).to_have_text(HOSTILE_ID)
    rows.locator("td.id button").click()
    expect(page.locator("#instance-name")).to_have_text(f"/threads/{HOSTILE_ID}")
    # No data-plane id is spelled so: the node refuses to look it up, and says so.
    expect(page.locator("#instance-error")).to_have_text("400 invalid instance id")

    assert page.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None
    no_page_errors(console)


def test_the_console_on_the_metrics_listener(console: Console, stack: Stack) -> None:
    page = console.page
    sign_in(page, stack.metrics_url, stack.operator)
    expect(page.locator("#workers tbody tr")).to_have_count(2)
    page.click("nav a[data-page=charts]")
    expect(page.locator("#chart-requests path.line").first).to_have_attribute(
        "d", re.compile("L"), timeout=REFRESH_MS
    )
    search(page, ns="/docs")
    expect(page.locator("#instances td.id", has_text="readme")).to_have_count(1)
    no_page_errors(console)


def test_the_node_serves_the_console_with_its_guards(stack: Stack) -> None:
    reply = stack.node.get("/_console/app.js")
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/javascript; charset=utf-8"
    csp = reply.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp, csp
    assert support.REPO.joinpath("console", "app.js").read_bytes() == reply.content
