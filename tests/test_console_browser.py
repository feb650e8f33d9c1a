"""``txcoord console`` in a real browser (Debian's headless Chromium, driven by Selenium) against a
lakehouse with live traffic: a running checker and a producer committing all along.

An operator signs in, follows a pending transaction until its producer commits it, and commits a
discarded one by hand (refused without a reason, then delivered exactly once); a viewer sees the
same pages without any action. Set ``TXCOORD_SCREENSHOTS=DIR`` to keep a PNG of each page visited
(``DIR/console-<page>.png``: docs/images holds the ones the documentation shows).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Callable

import pyarrow.compute as pc
import pytest
import requests
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from coordinator.checker.query import CheckerQuery
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.ops.status import read_metrics
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.protocol import CHECK_IMMUNITY_TIME_IN_SECONDS
from support import REPO_ROOT
from support import end_record, half_record
from support.producer_side import commit_log_version
from tests.test_cli import txcoord

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PASSWORDS = {"alice": "alice-operates-the-lakehouse", "victor": "victor-only-looks-around"}
REFRESH_S = 2  # how often the live pages reload themselves (`txcoord console --refresh`)
TIMEOUT_S = 60  # the longest any step may take (a Spark batch on a busy two-core machine takes a second or two)
#: Long enough that no check is ever due: these transactions wait for their producer's END.
NEVER_CHECKED = {CHECK_IMMUNITY_TIME_IN_SECONDS: "600"}
SHOTS = os.environ.get("TXCOORD_SCREENSHOTS")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
                       reason=f"needs Debian's headless Chromium ({CHROMIUM}) and its driver ({CHROMEDRIVER}): "
                              "sudo apt-get install chromium chromium-driver (`make test` does, as root)"),
]

#: A page may reload itself (meta refresh) between finding an element and using it: try again.
RELOADED = (StaleElementReferenceException, NoSuchElementException)


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    # The driver's path given: Selenium Manager is never asked (it would download a driver).
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def console_config(tmp_path, config) -> Path:
    """The configuration file of the checker and the console: checks fast, one only, then discard."""
    path = tmp_path / "coordinator.toml"
    path.write_text(f"lakehouse = {json.dumps(config.lakehouse)}\n"
                    "transaction_timeout_ms = 1000\ntransaction_check_interval_ms = 1000\n"
                    "transaction_check_max = 1\ntrigger_interval_ms = 200\n")
    for name, role in (("alice", "operator"), ("victor", "viewer")):
        added = txcoord("console-user", "add", name, "--role", role, "--password-stdin", "--config", str(path),
                        input=PASSWORDS[name] + "\n")
        assert added.returncode == 0, added.stderr
    return path


@pytest.fixture
def console(console_config, tmp_path):
    """``txcoord console`` as an operator starts it, on a free port; yields its URL (no trailing slash)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXCOORD_")}
    log = open(tmp_path / "console.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "coordinator", "console", "--config", str(console_config),
                                "--port", "0", "--refresh", str(REFRESH_S)],
                               stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO_ROOT, env=clean)
    try:
        first = process.stdout.readline()  # printed (and flushed) once it listens
        assert first.startswith("txcoord console: http://127.0.0.1:"), (first, (tmp_path / "console.log").read_text())
        yield first.split()[2].rstrip("/")
    finally:
        process.terminate()
        process.wait(30)
        log.close()


class LiveProducer:
    """A producer of group ``shop`` committing a transaction to topic ORDERS every few tenths of a second."""

    def __init__(self, lakehouse: str):
        self.lakehouse = lakehouse
        self.stopping = threading.Event()
        self.committed = 0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="live-producer", daemon=True)

    def _run(self) -> None:
        try:
            with CommitLogWriter(self.lakehouse, "shop") as writer:
                while not self.stopping.is_set():
                    transaction = f"order-{self.committed}"
                    writer.submit([half_record(transaction, group="shop", topic="ORDERS", properties=NEVER_CHECKED,
                                               body=json.dumps({"order": self.committed}).encode())]).result()
                    writer.submit([end_record(transaction, group="shop")]).result()
                    self.committed += 1
                    self.stopping.wait(0.3)  # the shop's pace, not a wait for anything
        except BaseException as error:  # noqa: BLE001  (reported by stop())
            self.errors.append(error)

    def __enter__(self) -> "LiveProducer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(30)
        assert not self.errors, self.errors


def screenshot(driver, page: str) -> None:
    """Keep a PNG of the page in $TXCOORD_SCREENSHOTS, once it and its images are loaded."""
    if not SHOTS:
        return
    WebDriverWait(driver, TIMEOUT_S).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && [...document.images].every(i => i.complete && i.naturalWidth > 0)"))
    Path(SHOTS).mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(Path(SHOTS) / f"console-{page}.png"))


def until(driver, condition: Callable, message: str, timeout_s: float = TIMEOUT_S):
    """``condition(driver)``'s first truthy answer, polled while pages reload themselves."""
    return WebDriverWait(driver, timeout_s, poll_frequency=0.2, ignored_exceptions=RELOADED).until(condition, message)


def act(driver, action: Callable, message: str) -> None:
    """Do ``action(driver)`` on the current page, again if the page reloaded itself meanwhile."""
    def done(d):
        action(d)
        return True
    until(driver, done, message)


def text_of(driver, css: str) -> str:
    element = driver.find_element(By.CSS_SELECTOR, css)
    try:
        return element.text
    except WebDriverException as error:
        # Chromium 156 reports an element that a reload of its page replaced as an inspector error, not as stale.
        if "does not belong to the document" in str(error):
            raise StaleElementReferenceException(str(error)) from error
        raise


def sign_in(driver, name: str, password: str) -> None:
    assert "/login" in driver.current_url
    for field, value in (("username", name), ("password", password)):
        driver.find_element(By.NAME, field).clear()
        driver.find_element(By.NAME, field).send_keys(value)
    driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()


def timeline(driver) -> list[tuple[str, str]]:
    """The (step, detail) rows of the transaction page's table#timeline."""
    rows = driver.find_elements(By.CSS_SELECTOR, "table#timeline tbody tr")
    return [(cells[1].text, cells[3].text) for cells in (row.find_elements(By.TAG_NAME, "td") for row in rows)]


def test_operators_follow_and_end_transactions_in_a_browser_while_traffic_flows(spark, console_config, console,
                                                                                 browser):
    config = CoordinatorConfig.load(console_config)
    lakehouse = Lakehouse.of(config)
    invoices = lakehouse.topic("INVOICES")
    driver = browser
    checker = CheckerQuery(spark, config).start()
    try:
        with LiveProducer(config.lakehouse) as shop, CommitLogWriter(lakehouse, "billing") as billing:
            # "waiting" stays pending until its producer ends it; nobody answers the checks of "gone" and
            # "left": each is discarded after one.
            billing.submit([half_record("waiting", group="billing", topic="INVOICES", properties=NEVER_CHECKED,
                                        body=b'{"invoice": "waiting"}')]).result()
            gone = [half_record("gone", group="billing", topic="INVOICES", message_index=i, message_count=2,
                                body=json.dumps({"invoice": "gone", "line": i}).encode()) for i in range(2)]
            billing.submit(gone + [half_record("left", group="billing", topic="INVOICES",
                                               body=b'{"invoice": "left"}')]).result()

            # Nothing without signing in: every page leads to the sign-in page, which shows no data.
            for path in ("/", "/pending", "/transactions/waiting"):
                driver.get(console + path)
                until(driver, lambda d: "/login?next=" in d.current_url, f"{path} did not lead to the sign-in page")
                assert text_of(driver, "h1") == "Sign in"
                page = driver.page_source
                assert config.lakehouse not in page and "waiting" not in page and "Pending transactions" not in page
            screenshot(driver, "login")
            sign_in(driver, "alice", "not-alices-password")
            until(driver, lambda d: "Unknown user or wrong password" in text_of(d, ".flash.error"),
                  "a wrong password was not refused")
            assert text_of(driver, "h1") == "Sign in" and "waiting" not in driver.page_source

            # The operator signs in (back to the page asked for) and finds the pending transaction of group billing.
            sign_in(driver, "alice", PASSWORDS["alice"])
            until(driver, lambda d: d.current_url.endswith("/transactions/waiting"), "not signed in")
            assert "alice (operator)" in text_of(driver, "header .who")
            driver.get(console + "/pending")
            act(driver, lambda d: (Select(d.find_element(By.ID, "group")).select_by_value("billing"),
                                   Select(d.find_element(By.ID, "older_than")).select_by_value("1h"),
                                   d.find_element(By.CSS_SELECTOR, "form.filters button").click()), "filters not set")
            until(driver, lambda d: "group=billing" in d.current_url and "older_than=1h" in d.current_url, "not filtered")
            until(driver, lambda d: "No pending transaction of billing older than 1h" in text_of(d, "table#pending"),
                  "the filtered table is not empty")
            act(driver, lambda d: (Select(d.find_element(By.ID, "older_than")).select_by_value(""),
                                   d.find_element(By.CSS_SELECTOR, "form.filters button").click()), "age filter not unset")
            until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-transaction="waiting"]'),
                  "the pending transaction never appeared on /pending")
            assert not driver.find_elements(By.CSS_SELECTOR, 'table#pending tr[data-transaction^="order-"]')  # shop's
            screenshot(driver, "pending")
            act(driver, lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-transaction="waiting"] a').click(),
                "no link to the timeline")
            until(driver, lambda d: d.current_url.endswith("/transactions/waiting"), "the row did not open the timeline")
            assert text_of(driver, "span#outcome") == "PENDING"
            assert {"half sent", "half stored"} <= {step for step, _ in timeline(driver)}
            assert "Commit by hand" in text_of(driver, "p#actions") and "Roll back by hand" in text_of(driver, "p#actions")
            screenshot(driver, "transaction")

            # Its producer commits it: the page, reloading itself, shows it committed and delivered.
            billing.submit([end_record("waiting", group="billing")]).result()

            def committed_and_delivered(d) -> list | None:  # one wait: the outcome shows before the delivery
                steps = timeline(d) if text_of(d, "span#outcome") == "COMMIT" else []
                return steps if "delivered" in [step for step, _ in steps] else None

            steps = until(driver, committed_and_delivered, "the producer's commit never showed delivered")
            assert ("end request", "COMMIT_MESSAGE from the producer") in steps
            assert [step for step, _ in steps].count("delivered") == 1
            assert not driver.find_elements(By.CSS_SELECTOR, "p#actions a")

            # "gone" is discarded: the operator commits it by hand from /discarded, after its preview.
            driver.get(console + "/discarded")
            until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-transaction="gone"]'),
                  "the discarded transaction never appeared on /discarded")
            screenshot(driver, "discarded")
            act(driver, lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-transaction="gone"]')
                .find_element(By.LINK_TEXT, "Commit by hand…").click(), "no Commit by hand… link")
            until(driver, lambda d: d.current_url.endswith("/transactions/gone/commit"), "no preview")
            previewed = [row.find_elements(By.TAG_NAME, "td") for row in
                         driver.find_elements(By.CSS_SELECTOR, "table#preview tbody tr")]
            # (in queue order: within a commit, that of the records' ids, not necessarily the messages')
            assert sorted((cells[1].text, cells[2].text, cells[5].text.split(" (")[0]) for cells in previewed) == sorted(
                ("INVOICES", m["msg_id"], m["body"].decode()) for m in gone)
            assert "delivers these 2 message(s)" in text_of(driver, "main")
            screenshot(driver, "commit")

            operators_log = commit_log_version(config.lakehouse, "operators/commit_log")
            reason, confirm = driver.find_element(By.NAME, "reason"), driver.find_element(By.NAME, "confirm")
            submit = driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]")
            assert submit.text == "Commit gone"
            confirm.click()
            submit.click()  # no reason: the browser itself refuses to send the form
            assert driver.execute_script("return arguments[0].validity.valueMissing", reason)
            assert driver.current_url.endswith("/transactions/gone/commit")
            reason.send_keys("   ")  # blank: sent, and refused by the console
            submit.click()
            until(driver, lambda d: "This field is required" in text_of(d, "form .bad"), "a blank reason was accepted")
            assert commit_log_version(config.lakehouse, "operators/commit_log") == operators_log  # nothing sent
            reason = driver.find_element(By.NAME, "reason")
            reason.clear()
            reason.send_keys("invoice paid by bank transfer, confirmed by phone")
            if not driver.find_element(By.NAME, "confirm").is_selected():
                driver.find_element(By.NAME, "confirm").click()
            driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()
            until(driver, lambda d: d.current_url.endswith("/transactions/gone"), "the commit was not sent")
            assert "the checker applies it at its next batch" in text_of(driver, ".flash.ok")
            until(driver, lambda d: text_of(d, "span#outcome") == "COMMIT", "the operator's commit never showed")
            until(driver, lambda d: [step for step, _ in timeline(d)].count("delivered") == 2, "not delivered")
            [end] = [detail for step, detail in timeline(driver) if step == "end request"]
            assert end.startswith(f"COMMIT_MESSAGE from operator alice (txcoord console on {socket.gethostname()})")
            assert end.endswith(": invoice paid by bank transfer, confirmed by phone")
            assert "discarded" in [step for step, _ in timeline(driver)]

            # Delivered exactly once, however many batches the checker runs after it.
            msg_ids = [m["msg_id"] for m in gone]
            batch = max(read_metrics(lakehouse, ["batch_id"]).column("batch_id").to_pylist())
            until(driver, lambda _: max(read_metrics(lakehouse, ["batch_id"]).column("batch_id").to_pylist()) >= batch + 5,
                  "the checker stopped running batches")
            delivered = read_table(invoices, ["msg_id", "body"], pc.field("msg_id").isin(msg_ids)).to_pylist()
            assert Counter(row["msg_id"] for row in delivered) == Counter(msg_ids)
            assert sorted(row["body"] for row in delivered) == sorted(m["body"] for m in gone)
            driver.get(console + "/discarded")  # reloads itself: read between reloads
            until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-transaction="left"]'), "no /discarded")
            assert not driver.find_elements(By.CSS_SELECTOR, 'tr[data-transaction="gone"]')

            # The overview, with a minute of traffic behind it.
            driver.get(console + "/?minutes=5")
            until(driver, lambda d: text_of(d, "#checker .value") == "alive", "no live checker on the overview")
            until(driver, lambda d: text_of(d, "#discarded-count .value") == "1"
                  and "1 committed since by hand" in text_of(d, "#discarded-count"), "wrong discarded counts")
            assert text_of(driver, "#last-batch .value").startswith("#") and text_of(driver, "#rejected-count .value") == "0"
            assert len(driver.find_elements(By.CSS_SELECTOR, ".charts img")) == 3
            screenshot(driver, "overview")
            act(driver, lambda d: d.find_element(By.XPATH, "//header//button[text()='Sign out']").click(), "no sign-out")
            until(driver, lambda d: "/login" in d.current_url, "not signed out")

            # A viewer reads the same pages, without any action.
            driver.get(console + "/discarded")
            sign_in(driver, "victor", PASSWORDS["victor"])
            until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-transaction="left"]'), "viewer: no /discarded")
            assert "victor (viewer)" in text_of(driver, "header .who")
            assert not driver.find_elements(By.PARTIAL_LINK_TEXT, "by hand")
            driver.get(console + "/transactions/left")  # reloads itself while DISCARD: read between reloads
            until(driver, lambda d: text_of(d, "span#outcome") == "DISCARD", "viewer: the outcome is not DISCARD")
            assert not driver.find_elements(By.ID, "actions") and not driver.find_elements(By.PARTIAL_LINK_TEXT, "by hand")
            driver.get(console + "/transactions/gone")
            assert any(step == "end request" and "from operator alice" in detail for step, detail in timeline(driver))
            driver.get(console + "/transactions/left/commit")
            assert text_of(driver, "h1") == "Not allowed" and "operator role" in text_of(driver, "main")
            assert not driver.find_elements(By.NAME, "reason")
            cookies = {c["name"]: c["value"] for c in driver.get_cookies()}
            direct = requests.get(console + "/transactions/left/commit", cookies=cookies, allow_redirects=False, timeout=30)
            assert direct.status_code == 403  # the viewer's own session, not a sign-in page
            assert commit_log_version(config.lakehouse, "operators/commit_log") == operators_log + 1  # alice's only
        assert shop.committed > 0
        shop_delivered = read_table(lakehouse.topic("ORDERS"), ["msg_id"]).column("msg_id").to_pylist()
        assert len(shop_delivered) == len(set(shop_delivered)) > 0  # the traffic went on all along, once each
    finally:
        checker.stop()


def test_an_operator_redrives_and_discards_dead_letters_in_a_browser_and_a_viewer_only_sees_them(console_config,
                                                                                                  console, browser):
    """No checker needed: a consumer group's dead letters, made by a real consumer whose listener fails."""
    import re

    from coordinator import ConsumeResult, TopicConsumer
    from coordinator.ops.consumer_groups import add_consumer_group, open_dead_letters, operator_actions
    from support.consumers import RecordingListener, TopicFeed
    from support.waiting import wait_until

    config = CoordinatorConfig.load(console_config).replace(consumer_max_attempts=1, consumer_poll_interval_ms=5,
                                                            consumer_heartbeat_ms=60_000)
    add_consumer_group(config, "credits", ["ORDERS"], shares=2, operator="platform@test")
    feed = TopicFeed(config)
    feed.deliver("ORDERS", [("K1", b'{"order": 1}'), ("K2", b'{"order": 2}')])
    feed.close()
    with TopicConsumer("credits", ["ORDERS"], RecordingListener(lambda m: ConsumeResult.FAILURE), config):
        dead = wait_until(lambda: len(open_dead_letters(config, "credits")) == 2 and open_dead_letters(config, "credits"),
                          30, "two dead letters")
    first, second = sorted(dead, key=lambda d: d["keys"])
    driver = browser

    driver.get(console + "/consumers")
    sign_in(driver, "alice", PASSWORDS["alice"])
    until(driver, lambda d: d.current_url.endswith("/consumers"), "not signed in")
    row = 'tr[data-group="credits"][data-topic="ORDERS"]'
    until(driver, lambda d: text_of(d, f"{row} .lag-messages") == "0" and text_of(d, f"{row} .dead-letters") == "2",
          "the group's lag is not 0 or its dead letters not 2")
    screenshot(driver, "consumers")
    act(driver, lambda d: d.find_element(By.LINK_TEXT, "credits").click(), "no link to the group")
    until(driver, lambda d: d.current_url.endswith("/consumers/credits"), "the group's page did not open")
    assert {r.get_attribute("data-msg-id") for r in driver.find_elements(By.CSS_SELECTOR, "table#dead-letters tbody tr")} \
        == {first["msg_id"], second["msg_id"]}
    driver.find_element(By.CSS_SELECTOR, f'input[name="msg_id"][value="{first["msg_id"]}"]').click()
    driver.find_element(By.NAME, "reason").send_keys("credits service fixed")
    driver.find_element(By.XPATH, "//button[text()='Redrive chosen']").click()
    until(driver, lambda d: "1 dead letter(s) of credits redriven" in text_of(d, ".flash.ok"), "no redrive")
    assert [r.get_attribute("data-msg-id") for r in driver.find_elements(
        By.CSS_SELECTOR, "table#dead-letters tbody tr")] == [second["msg_id"]]
    screenshot(driver, "consumer-group")
    driver.find_element(By.CSS_SELECTOR, f'input[name="msg_id"][value="{second["msg_id"]}"]').click()
    driver.find_element(By.XPATH, "//button[text()='Discard chosen']").click()
    until(driver, lambda d: "1 dead letter(s) of credits discarded for good" in text_of(d, ".flash.ok"), "no discard")
    assert "No open dead letter" in text_of(driver, "table#dead-letters")
    assert text_of(driver, "table#actions").count("alice (txcoord console on") == 2
    assert open_dead_letters(config, "credits") == []
    assert sorted((a["action"], a["msg_id"]) for a in operator_actions(config, "credits")) == [
        ("DISCARD", second["msg_id"]), ("REDRIVE", first["msg_id"])]
    act(driver, lambda d: d.find_element(By.XPATH, "//header//button[text()='Sign out']").click(), "no sign-out")
    until(driver, lambda d: "/login" in d.current_url, "not signed out")

    # A viewer sees the group and its actions, with nothing to tick or press; the console refuses a viewer's POST.
    driver.get(console + "/consumers/credits")
    sign_in(driver, "victor", PASSWORDS["victor"])
    until(driver, lambda d: d.current_url.endswith("/consumers/credits"), "viewer: no group page")
    until(driver, lambda d: "credits service fixed" in text_of(d, "table#actions"), "viewer: no operators' actions")
    assert not driver.find_elements(By.NAME, "msg_id") and not driver.find_elements(By.CSS_SELECTOR, "#dead-letter-actions")
    cookies = {c["name"]: c["value"] for c in driver.get_cookies()}
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', driver.page_source).group(1)
    refused = requests.post(console + "/consumers/credits/dead-letters/redrive", cookies=cookies, timeout=30,
                            data={"csrf_token": token, "msg_id": second["msg_id"]}, allow_redirects=False)
    assert refused.status_code == 403 and "operator role" in refused.text
    assert len(operator_actions(config, "credits")) == 2  # nothing more done
