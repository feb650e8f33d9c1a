"""Bounded retries of storage requests (coordinator.retries): what is tried again, for how long, and
what is counted and logged. Against a real S3 server, through a proxy that injects the faults, in
tests/test_object_storage_faults.py; here the requests are callables that fail as obstore does."""

from __future__ import annotations

import logging

import pytest
import stamina
from obstore.exceptions import GenericError, PreconditionError

from coordinator.exceptions import ConfigError, StorageUnavailableError, WriteOutcomeUnknownError
from coordinator.retries import (DEFAULT_MAX_RETRIES, DEFAULT_RETRY_TIMEOUT_S, RetryPolicy, note_commit_race_lost,
                                 retrying, storage_request_counts)

LOCATION = "s3://lakehouse/lh/system/_checker_lease.json"


def obstore_error(method: str, elapsed: str, says: str, inner: str) -> GenericError:
    """A ``GenericError`` worded as obstore 0.12 words one (captured through coordinator/conformance/faults.py): its
    first line, then the debug dump, whose ``elapsed`` and ``retry_timeout`` must not be read as a cause."""
    return GenericError(f"Generic S3 error: Error performing {method} http://127.0.0.1:38867/lakehouse/lh/k in {elapsed} - "
                        f"{says}\n\nDebug source:\nGeneric {{\n    store: \"S3\",\n    source: RetryError(\n        "
                        f"RetryErrorImpl {{\n            method: {method},\n            retries: 0,\n            "
                        f"max_retries: 0,\n            elapsed: {elapsed},\n            retry_timeout: 180s,\n            "
                        f"inner: {inner},\n        }},\n    ),\n}}")


SLOW_DOWN = obstore_error("PUT", "1.115113ms", "Server returned non-2xx status code: 503 Service Unavailable: <?xml "
                          "version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your "
                          "request rate.</Message></Error>", "Status {\n                status: 503,\n            }")
INTERNAL = obstore_error("GET", "294.257µs", "Server returned non-2xx status code: 500 Internal Server Error: "
                         "<Error><Code>InternalError</Code></Error>", "Status {\n                status: 500,\n            }")
# The elapsed times look like a 4xx and a 504: the causes must come from the error, not from them.
RESET = obstore_error("PUT", "474.673µs", "HTTP error: error sending request",
                      "Http { kind: Interrupted, source: hyper::Error(Io, Os { code: 104, kind: ConnectionReset }) }")
REPLY_LOST = obstore_error("PUT", "504.748µs", "HTTP error: error sending request",
                           "Http { kind: Request, source: hyper::Error(IncompleteMessage) }")
BAD_REQUEST = obstore_error("PUT", "503.2µs", "Server returned non-2xx status code: 400 Bad Request: "
                            "<Code>InvalidArgument</Code>", "Status {\n                status: 400,\n            }")


@pytest.fixture
def no_backoff():
    """Retries without their waits (stamina's testing mode), each policy's attempts still counting."""
    stamina.set_testing(True, attempts=1_000, cap=True)
    yield
    stamina.set_testing(False)


class Failing:
    """A request failing with ``errors`` in turn, then answering ``result``; counts its calls."""

    def __init__(self, *errors: Exception, result: object = "etag-1"):
        self.errors, self.result, self.calls = list(errors), result, 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


def test_the_policy_comes_from_the_storage_settings_delta_rs_reads_too():
    assert RetryPolicy.of({}) == RetryPolicy(DEFAULT_MAX_RETRIES, DEFAULT_RETRY_TIMEOUT_S)
    assert RetryPolicy.of({"max_retries": "3", "retry_timeout": "500ms"}) == RetryPolicy(3, 0.5)
    assert RetryPolicy.of({"retry_timeout": "2m"}).timeout_s == 120
    for bad in ({"max_retries": "many"}, {"max_retries": "-1"}, {"retry_timeout": "soon"}, {"retry_timeout": "0s"}):
        with pytest.raises(ConfigError, match="max_retries|retry_timeout"):
            RetryPolicy.of(bad)


def test_throttling_server_errors_and_lost_connections_are_retried_counted_and_logged(no_backoff, caplog):
    before = storage_request_counts()
    request = Failing(SLOW_DOWN, INTERNAL, RESET, REPLY_LOST)
    with caplog.at_level(logging.WARNING, logger="coordinator.storage"):
        assert retrying(RetryPolicy(5, 60), "create", LOCATION, request) == "etag-1"

    assert request.calls == 5
    after = storage_request_counts().retries
    for cause, times in (("throttled", 1), ("server_error", 1), ("connection", 2)):
        assert after[("create", cause)] == before.retries.get(("create", cause), 0) + times
    assert after.get(("create", "timeout"), 0) == before.retries.get(("create", "timeout"), 0)
    retried = [r.getMessage() for r in caplog.records if "retried" in r.getMessage()]
    assert len(retried) == 4 and all(LOCATION in line for line in retried)
    assert "throttled" in retried[0] and "SlowDown" in retried[0] and "(attempt 2)" in retried[0]


def test_what_would_fail_again_is_raised_at_once(no_backoff):
    for error in (BAD_REQUEST, PreconditionError("precondition"), FileNotFoundError("gone"), ValueError("bug")):
        request = Failing(error)
        with pytest.raises(type(error)):
            retrying(RetryPolicy(5, 60), "read", LOCATION, request)
        assert request.calls == 1


def test_past_max_retries_a_clear_error_names_the_request_the_bound_and_the_last_failure(no_backoff):
    before = storage_request_counts().exhausted.get(("replace", "throttled"), 0)
    request = Failing(*[SLOW_DOWN] * 10)
    with pytest.raises(WriteOutcomeUnknownError) as raised:
        retrying(RetryPolicy(2, 60), "replace", LOCATION, request, conditional_write=True)

    assert request.calls == 3  # the first attempt and two retries
    message = str(raised.value)
    assert message.startswith(f"{LOCATION}: replace failed 3 time(s)")
    assert "2 retries" in message and "max_retries and retry_timeout" in message and "SlowDown" in message
    assert isinstance(raised.value, StorageUnavailableError) and raised.value.__cause__ is SLOW_DOWN
    assert storage_request_counts().exhausted[("replace", "throttled")] == before + 1


def test_retry_timeout_bounds_the_time_whatever_max_retries_allows():
    """Real backoff (50 ms, doubling, jittered): a 3 s bound stops a request that fails every time
    long before its million retries (the waits up to 3 s add up to 3.15 s at the least: seven calls at most).
    The bound is seconds, not less: a loaded machine must not let the first call alone outlast it."""
    request = Failing(*[INTERNAL] * 1_000)
    with pytest.raises(StorageUnavailableError, match="1000000 retries and 3 s"):
        retrying(RetryPolicy(1_000_000, 3), "read", LOCATION, request)
    assert 1 < request.calls < 20


def test_the_checkers_metrics_serve_the_counts_of_this_process(no_backoff):
    from prometheus_client import generate_latest

    from coordinator.checker.exporter import CheckerExporter

    def sample(text: str, name: str) -> float:
        return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)), 0.0)

    retried = 'txcoord_storage_retries_total{cause="throttled",operation="put"}'
    failed = 'txcoord_storage_requests_failed_total{cause="server_error",operation="put"}'
    races = "txcoord_storage_commit_races_lost_total"
    exporter = CheckerExporter()
    before = generate_latest(exporter.registry).decode()
    retrying(RetryPolicy(3, 60), "put", LOCATION, Failing(SLOW_DOWN, SLOW_DOWN))
    with pytest.raises(StorageUnavailableError):
        retrying(RetryPolicy(0, 60), "put", LOCATION, Failing(INTERNAL))
    note_commit_race_lost()
    after = generate_latest(exporter.registry).decode()

    assert sample(after, retried) == sample(before, retried) + 2
    assert sample(after, failed) == sample(before, failed) + 1
    assert sample(after, races) == sample(before, races) + 1
    assert "# TYPE txcoord_storage_own_writes_recognised_total counter" in after
