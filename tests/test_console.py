"""``txcoord console`` over HTTP: nothing without signing in, roles, forms from elsewhere refused,
and what the pages show and do against a lakehouse the checker's batch logic writes."""

from __future__ import annotations

import datetime as dt
import socket

import pytest

from coordinator.checker.metrics import CheckerMetrics
from coordinator.exceptions import ConfigError
from coordinator.ops.audit import outcome, transaction_timeline
from coordinator.web import OPERATOR, VIEWER, ConsoleUsers, console_server
from support import end_record, half_record
from support.console_client import ConsoleSession, running_console, signed_in
from support.lakehouse import metrics_row
from support.producer_side import commit_log_version
from tests.test_cli import txcoord

PASSWORDS = {"alice": "alice-operates-the-lakehouse", "victor": "victor-only-looks-around"}
OPERATORS_LOG = "operators/commit_log"
PAGES = ["/", "/pending", "/discarded", "/transactions/t1", "/transactions/t1/commit", "/charts/throughput.svg",
         "/consumers", "/consumers/credits"]


@pytest.fixture
def users_file(tmp_path):
    users = ConsoleUsers(tmp_path / "console-users.toml")
    users.add("alice", OPERATOR, PASSWORDS["alice"])
    users.add("victor", VIEWER, PASSWORDS["victor"])
    return users.path


@pytest.fixture
def console(checker, users_file):
    with running_console(checker.config, users_file) as url:
        yield url


def test_nothing_is_served_without_signing_in(checker, console):
    checker.write(half_record("hidden-txn", body=b"secret order"))
    checker.run()
    anonymous = ConsoleSession(console)
    for path in PAGES:
        page = anonymous.get(path)
        assert page.status_code == 302 and page.headers["Location"].startswith("/login?next="), path
        assert "hidden-txn" not in page.text and checker.config.lakehouse not in page.text
    for name, password in [("alice", "not-her-password"), ("mallory", PASSWORDS["alice"]), ("alice", "")]:
        refused = anonymous.sign_in(name, password)
        assert refused.status_code in (200, 401) and "Sign in" in refused.text
        assert anonymous.get("/pending").status_code == 302  # still nobody
    assert anonymous.post("/login", {"username": "alice", "password": PASSWORDS["alice"]}, token="").status_code == 400
    assert anonymous.sign_in("alice", PASSWORDS["alice"]).status_code == 302
    assert "hidden-txn" in anonymous.get("/pending").text
    assert anonymous.post("/logout", {}, token=anonymous.csrf_token("/")).status_code == 302
    assert anonymous.get("/pending").status_code == 302  # signed out


def test_a_sign_in_never_redirects_to_another_site(console):
    session = ConsoleSession(console)
    token = session.csrf_token("/login")
    for target in ("https://evil.example/", "//evil.example/x"):
        answer = session.http.post(f"{console}/login", params={"next": target}, allow_redirects=False, timeout=30,
                                   data={"csrf_token": token, "username": "victor", "password": PASSWORDS["victor"]})
        assert answer.status_code == 302 and answer.headers["Location"] == "/", target


def test_a_console_without_users_does_not_start(config, tmp_path):
    with pytest.raises(ConfigError, match="no console user"):
        console_server(config, tmp_path / "nobody.toml", port=0)
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(f"lakehouse = '{config.lakehouse}'\n")
    started = txcoord("console", "--config", str(config_file), "--port", "0")
    assert started.returncode == 2 and "txcoord console-user add" in started.stderr


def test_console_user_keeps_only_hashes_readable_by_its_owner(tmp_path):
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text("lakehouse = 'lh'\n")
    added = txcoord("console-user", "add", "olga", "--role", "operator", "--password-stdin", "--config", str(config_file),
                    input="olga-has-a-long-password\n")
    assert added.returncode == 0, added.stderr
    users_file = tmp_path / "console-users.toml"
    assert "olga-has-a-long-password" not in users_file.read_text() and users_file.stat().st_mode & 0o777 == 0o600
    assert ConsoleUsers.load(users_file).authenticate("olga", "olga-has-a-long-password").role == OPERATOR
    short = txcoord("console-user", "add", "pat", "--role", "viewer", "--password-stdin", "--config", str(config_file),
                    input="short\n")
    assert short.returncode == 2 and "at least 12 characters" in short.stderr
    assert txcoord("console-user", "list", "--config", str(config_file)).stdout == "olga\toperator\n"
    assert txcoord("console-user", "remove", "olga", "--config", str(config_file)).returncode == 0
    assert ConsoleUsers.load(users_file).names() == []


def test_forms_from_elsewhere_are_refused_and_write_nothing(checker, console):
    checker.write(half_record("t1"))
    checker.run()
    alice = signed_in(console, "alice", PASSWORDS["alice"])
    other = signed_in(console, "alice", PASSWORDS["alice"])  # another browser: its token is not this session's
    version = commit_log_version(checker.config.lakehouse, OPERATORS_LOG)
    form = {"reason": "forged", "confirm": "y"}
    for token in ("", other.csrf_token("/transactions/t1/commit"), "made-up"):
        refused = alice.post("/transactions/t1/commit", form, token=token)
        assert refused.status_code == 400 and "did not come from this console" in refused.text
    assert commit_log_version(checker.config.lakehouse, OPERATORS_LOG) == version
    page = alice.get("/pending")
    assert page.headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    cookie = ConsoleSession(console).sign_in("victor", PASSWORDS["victor"]).headers["Set-Cookie"]
    assert "SameSite=Strict" in cookie and "HttpOnly" in cookie  # no other site's page sends it along


def test_pending_shows_a_committed_transaction_its_topic_cannot_take_as_withheld_with_the_reason(checker, console):
    from deltalake import write_deltalake
    import pyarrow as pa

    write_deltalake(checker.path("BROKEN"), pa.table({"something_else": [1]}))  # a table of other columns
    checker.write(half_record("stuck", topic="BROKEN"), half_record("fine", topic="T"))
    checker.write(end_record("stuck"), end_record("fine"))
    checker.run()
    page = signed_in(console, "victor", PASSWORDS["victor"]).get("/pending").text

    assert 'data-transaction="stuck"' in page and 'data-transaction="fine"' not in page
    assert "deliver: withheld" in page and "topic &#39;BROKEN&#39; cannot be written" in page


def test_pending_lists_oldest_first_with_filters_and_links_to_timelines(checker, console):
    checker.write(half_record("older", group="g", topic="T"))
    checker.run()
    checker.write(half_record("newer", group="h", topic="U"))
    checker.run()
    victor = signed_in(console, "victor", PASSWORDS["victor"])

    page = victor.get("/pending").text
    assert page.index('data-transaction="older"') < page.index('data-transaction="newer"')
    assert 'href="/transactions/older"' in page and "2 pending transaction(s)" in page
    only_h = victor.get("/pending", group="h").text
    assert 'data-transaction="newer"' in only_h and 'data-transaction="older"' not in only_h
    assert "No pending transaction" in victor.get("/pending", older_than="1h").text
    assert "not a duration" in victor.get("/pending", older_than="soon").text

    timeline = victor.get("/transactions/older").text
    assert "PENDING" in timeline and "half stored" in timeline and "queue offset" in timeline
    assert "Commit by hand" not in timeline  # a viewer's page offers no action
    assert victor.get("/transactions/nobody").status_code == 404


def test_an_operator_commits_a_discarded_transaction_once_with_a_reason(checker, console):
    checker.discard("gone", messages=2)
    alice = signed_in(console, "alice", PASSWORDS["alice"])
    assert 'data-transaction="gone"' in alice.get("/discarded").text

    preview = alice.get("/transactions/gone/commit").text
    assert preview.index("gone 0") < preview.index("gone 1") and "delivers these 2 message(s)" in preview
    version = commit_log_version(checker.config.lakehouse, OPERATORS_LOG)
    for incomplete in ({"reason": "  ", "confirm": "y"}, {"reason": "paid after all"}):
        assert alice.post("/transactions/gone/commit", incomplete).status_code == 422
    assert commit_log_version(checker.config.lakehouse, OPERATORS_LOG) == version  # nothing sent

    sent = alice.post("/transactions/gone/commit", {"reason": "paid after all", "confirm": "y"})
    assert sent.status_code == 302 and sent.headers["Location"] == "/transactions/gone"
    assert "the checker applies it at its next batch" in alice.get("/transactions/gone").text
    checker.run()
    checker.run()
    assert sorted(bytes(r.body) for r in checker.rows("T")) == [b"gone 0", b"gone 1"]  # delivered, once
    events = transaction_timeline(checker.config.lakehouse, "gone")
    assert outcome(events) == "COMMIT"
    [end] = [e for e in events if e.step == "end request"]
    assert f"from operator alice (txcoord console on {socket.gethostname()})" in end.detail
    assert end.detail.endswith(": paid after all")

    assert 'data-transaction="gone"' not in alice.get("/discarded").text
    again = alice.get("/transactions/gone/commit")
    assert again.status_code == 409 and "resolved for good" in again.text
    checker.run()
    assert len(checker.rows("T")) == 2


def test_a_preview_lists_the_messages_in_the_transactions_order(checker, console):
    # Record ids in the opposite order: the checker numbers a commit's halves by record id, not by message.
    checker.write(*(half_record("multi", message_index=i, message_count=3, body=f"message {i}".encode(), record_id=rid)
                    for i, rid in enumerate(("c", "b", "a"))))
    checker.run()
    preview = signed_in(console, "alice", PASSWORDS["alice"]).get("/transactions/multi/commit").text
    assert preview.index("message 0") < preview.index("message 1") < preview.index("message 2")


def test_an_operator_rolls_back_a_pending_transaction(checker, console):
    checker.write(half_record("stuck"))
    checker.run()
    alice = signed_in(console, "alice", PASSWORDS["alice"])
    assert "drops these 1 message(s)" in alice.get("/transactions/stuck/rollback").text
    assert alice.post("/transactions/stuck/rollback", {"reason": "order cancelled", "confirm": "y"}).status_code == 302
    checker.run()
    assert outcome(transaction_timeline(checker.config.lakehouse, "stuck")) == "ROLLBACK"
    assert alice.get("/transactions/stuck/maybe").status_code == 404


def test_a_viewer_reads_but_cannot_act(checker, console):
    checker.discard("gone")
    victor = signed_in(console, "victor", PASSWORDS["victor"])
    assert 'data-transaction="gone"' in victor.get("/discarded").text
    assert "Commit by hand" not in victor.get("/discarded").text
    version = commit_log_version(checker.config.lakehouse, OPERATORS_LOG)
    assert victor.get("/transactions/gone/commit").status_code == 403
    token = victor.csrf_token("/discarded")
    refused = victor.post("/transactions/gone/commit", {"reason": "let me", "confirm": "y"}, token=token)
    assert refused.status_code == 403 and "operator role" in refused.text
    assert commit_log_version(checker.config.lakehouse, OPERATORS_LOG) == version


def test_the_overview_shows_the_checkers_health_and_charts_its_batches(checker, console):
    checker.write(half_record("a", topic="orders"), end_record("a"))
    checker.run()
    victor = signed_in(console, "victor", PASSWORDS["victor"])
    assert "no batch in this window" in victor.get("/charts/batches.svg").text
    now = dt.datetime.now(dt.timezone.utc)
    metrics = CheckerMetrics(checker.config.lakehouse, app_id="console-test")
    metrics.record(metrics_row(batch_id=1, started_at=now - dt.timedelta(seconds=3), finished_at=now - dt.timedelta(seconds=2),
                               duration_ms=1000, delivered=1, delivered_by_topic={"orders": 40},
                               visible_p50_ms_by_topic={"orders": 350}, visible_p99_ms_by_topic={"orders": 900}))

    page = victor.get("/").text
    assert 'http-equiv="refresh"' in page  # it follows the lakehouse by itself
    assert "#1" in page and "not running" in page  # a recorded batch, and no checker holds the lease
    throughput = victor.get("/charts/throughput.svg")
    assert throughput.headers["Content-Type"].startswith("image/svg+xml") and ">orders<" in throughput.text
    assert ">orders p50<" in victor.get("/charts/latency.svg").text and ">orders p99<" in victor.get("/charts/latency.svg").text
    assert "no batch in this window" not in victor.get("/charts/batches.svg", minutes=5).text
    assert victor.get("/charts/nothing.svg").status_code == 404


def test_the_charts_window_is_topped_up_with_new_batches_and_survives_compaction(config):
    from coordinator.lakehouse import Lakehouse, init_lakehouse
    from coordinator.tables import METRICS
    from coordinator.web.recent import RecentBatches

    init_lakehouse(config.lakehouse)
    lakehouse = Lakehouse(config.lakehouse)
    metrics = CheckerMetrics(lakehouse, app_id="recent-test")
    now = dt.datetime.now(dt.timezone.utc)

    def record(batch_id: int, age_min: float) -> None:
        finished = now - dt.timedelta(minutes=age_min)
        metrics.record(metrics_row(batch_id=batch_id, started_at=finished, finished_at=finished))

    def finished_times(recent: RecentBatches, since_min: float = 60) -> list[int]:
        return [int(t.timestamp()) for t in recent.since(now - dt.timedelta(minutes=since_min), now)
                .column("finished_at").to_pylist()]

    recent = RecentBatches(lakehouse, keep=dt.timedelta(minutes=30))
    assert recent.since(now - dt.timedelta(minutes=30), now).num_rows == 0
    record(1, 45)  # older than the window kept
    record(2, 20)
    record(3, 10)
    assert recent.since(now - dt.timedelta(minutes=30), now).num_rows == 2
    record(4, 5)
    assert recent.since(now - dt.timedelta(minutes=30), now).num_rows == 3  # topped up with the new file
    assert recent.since(now - dt.timedelta(minutes=15), now).num_rows == 2
    lakehouse.table(METRICS).optimize.compact()  # the files read so far are gone
    record(5, 1)
    assert recent.since(now - dt.timedelta(minutes=30), now).num_rows == 4  # each batch once
    assert finished_times(recent) == sorted(finished_times(recent))


def test_consumer_groups_pages_show_what_describe_shows_and_only_operators_act_on_dead_letters(config, users_file):
    """The consumer pages read through ``describe_consumer_group`` and ``open_dead_letters``, as the CLI does; a
    viewer's POST is refused by the console itself, an operator's redrive and discard are recorded with their name."""
    from coordinator import ConsumeResult, TopicConsumer
    from coordinator.lakehouse import Lakehouse, read_table
    from coordinator.ops.consumer_groups import add_consumer_group, describe_consumer_group, open_dead_letters
    from support.consumers import RecordingListener, TopicFeed
    from support.waiting import wait_until

    config = config.replace(consumer_max_attempts=1, consumer_poll_interval_ms=5, consumer_heartbeat_ms=60_000)
    add_consumer_group(config, "credits", ["ORDERS"], shares=2, operator="platform@test")
    feed = TopicFeed(config)
    feed.deliver("ORDERS", [("K1", b"bad one"), ("K2", b"bad two"), ("K3", b"good")])
    listener = RecordingListener(lambda m: ConsumeResult.SUCCESS if m.body == b"good" else ConsumeResult.FAILURE)
    with TopicConsumer("credits", ["ORDERS"], listener, config):
        dead = wait_until(lambda: len(open_dead_letters(config, "credits")) == 2 and open_dead_letters(config, "credits"),
                          30, "two dead letters")
    feed.deliver("ORDERS", [("K4", b"waiting")])
    feed.close()
    by_body = {d["body"]: d["msg_id"] for d in dead}
    described = describe_consumer_group(config, "credits")
    [orders] = [t for t in described.topics if t.topic == "ORDERS"]
    assert orders.lag_messages == 1 and described.open_dead_letters == 2  # what the pages must show

    with running_console(config, users_file) as url:
        victor, alice = signed_in(url, "victor", PASSWORDS["victor"]), signed_in(url, "alice", PASSWORDS["alice"])
        listing = victor.get("/consumers").text
        assert 'data-group="credits" data-topic="ORDERS"' in listing and 'href="/consumers/credits"' in listing
        row = listing[listing.index('data-topic="ORDERS"'):]
        assert '"num lag-messages">1<' in row and '"num dead-letters"><span class="badge overdue">2<' in row

        page = victor.get("/consumers/credits").text
        assert all(f'data-msg-id="{msg_id}"' in page for msg_id in by_body.values()) and "bad one" in page
        assert 'name="msg_id"' not in page and "Redrive chosen" not in page  # a viewer is offered no action
        token = victor.csrf_token("/consumers/credits")
        refused = victor.post("/consumers/credits/dead-letters/discard", {"msg_id": by_body[b"bad one"]}, token=token)
        assert refused.status_code == 403 and "operator role" in refused.text
        assert len(open_dead_letters(config, "credits")) == 2  # nothing done

        page = alice.get("/consumers/credits").text
        assert page.count('name="msg_id"') == 2 and "Redrive chosen" in page
        token = alice.csrf_token("/consumers/credits")
        for form, said in (({}, "Tick the dead letters to redrive first"),
                           ({"msg_id": "no-such-message"}, "no open dead letter of message(s) no-such-message"),
                           ({"msg_id": by_body[b"bad one"], "reason": "x" * 5000}, "Field cannot be longer than")):
            answer = alice.post("/consumers/credits/dead-letters/redrive", form, token=token)
            assert answer.status_code == 302 and said in alice.get("/consumers/credits").text, said
        assert len(open_dead_letters(config, "credits")) == 2
        assert alice.post("/consumers/credits/dead-letters/redrive", {"msg_id": by_body[b"bad one"]}, token="").status_code == 400
        done = alice.post("/consumers/credits/dead-letters/redrive",
                          {"msg_id": by_body[b"bad one"], "reason": "fixed the listener"}, token=token)
        assert done.status_code == 302 and done.headers["Location"] == "/consumers/credits"
        page = alice.get("/consumers/credits").text
        assert "1 dead letter(s) of credits redriven" in page
        assert alice.post("/consumers/credits/dead-letters/discard", {"msg_id": by_body[b"bad two"]},
                          token=token).status_code == 302
        assert open_dead_letters(config, "credits") == []
        page = victor.get("/consumers/credits").text
        assert "No open dead letter" in page and "fixed the listener" in page and "alice (txcoord console on" in page

        assert alice.post("/consumers/credits/dead-letters/explode", {"msg_id": "x"}, token=token).status_code == 404
        # One group's corrupt record: its own page says why, the list names it and shows the others.
        add_consumer_group(config, "audit", ["ORDERS"], shares=2, operator="platform@test")
        Lakehouse.of(config).files.put("consumers/audit/progress/ORDERS/1.json", b"not a progress record")
        broken = victor.get("/consumers/audit")
        assert broken.status_code == 409 and "consumers/audit/progress/ORDERS/1.json is not a share&#39;s progress" in broken.text
        listing = victor.get("/consumers")
        assert listing.status_code == 200 and 'data-group="credits"' in listing.text and 'data-group="audit"' not in listing.text
        assert "Left out: consumer group audit: consumers/audit/progress/ORDERS/1.json" in listing.text
        bad = victor.get("/consumers/no%20such%20group")
        assert bad.status_code == 400 and "consumer group" in bad.text
        assert victor.get("/consumers/nobody").status_code == 404
    actions = read_table(Lakehouse.of(config).consumer_table("credits", "operator_actions")).to_pylist()
    assert sorted((a["action"], a["msg_id"], a["detail"]) for a in actions) == [
        ("DISCARD", by_body[b"bad two"], None), ("REDRIVE", by_body[b"bad one"], "fixed the listener")]
    assert all(a["operator"] == f"alice (txcoord console on {socket.gethostname()})" for a in actions)
    redriven = read_table(Lakehouse.of(config).consumer_table("credits", "redrive")).to_pylist()
    assert [r["body"] for r in redriven] == [b"bad one"]  # delivered to the group again when it runs
