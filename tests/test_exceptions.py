"""What each public error tells its caller: whether the same call may succeed if made again as it was
(``retriable``), and whether what it was to write may or may not have been written (``outcome_unknown``)."""

from __future__ import annotations

import pytest

from coordinator import exceptions
from coordinator.exceptions import (CoordinatorError, HalfOutcomeUnknownError, StorageUnavailableError,
                                    WriteOutcomeUnknownError)

#: (retriable, outcome_unknown) of every public error, as a caller reads them.
EXPECTED = {
    "CoordinatorError": (False, False),
    "ConfigError": (False, False),
    "InvalidArgumentError": (False, False),
    "MessageValidationError": (False, False),
    "IncompleteListenerError": (False, False),
    "HalfNotStoredError": (False, False),  # unless its cause was retriable (tests/test_producer.py)
    "HalfOutcomeUnknownError": (True, True),
    "ProducerStateError": (False, False),
    "ConsumerStateError": (False, False),
    "PositionGoneError": (False, False),
    "LakehouseNotFoundError": (False, False),
    "OutdatedLakehouseError": (False, False),
    "AccessDeniedError": (False, False),
    "CorruptInputError": (False, False),
    "FileTooLargeError": (False, False),
    "StorageUnavailableError": (True, False),
    "WriteOutcomeUnknownError": (True, True),
    "SparkSetupError": (False, False),
    "CheckerAlreadyRunningError": (False, False),
    "LeaseLostError": (False, False),
    "CheckpointMismatchError": (False, False),
    "UnsupportedTableError": (False, False),
    "CheckerStateError": (False, False),
    "StopRequested": (False, False),
    "ConformanceKitError": (False, False),
    "CaseFailedError": (False, False),
}
PUBLIC_ERRORS = [name for name in exceptions.__all__ if isinstance(getattr(exceptions, name), type)]


def test_every_public_error_is_listed_here():
    assert sorted(EXPECTED) == sorted(PUBLIC_ERRORS)


@pytest.mark.parametrize("name", PUBLIC_ERRORS)
def test_each_error_says_whether_to_retry_and_whether_its_outcome_is_known(name):
    error_class = getattr(exceptions, name)
    arguments = {"HalfOutcomeUnknownError": ("lost reply", "0190a1b2")}.get(name, ("message",))
    error = error_class(*arguments)
    assert (error.retriable, error.outcome_unknown) == EXPECTED[name]
    assert (error_class.retriable, error_class.outcome_unknown) == EXPECTED[name]  # readable without an instance
    assert isinstance(error.retriable, bool) and isinstance(error.outcome_unknown, bool)


def test_the_outcome_unknown_errors_are_the_two_that_say_so():
    assert [name for name in PUBLIC_ERRORS if getattr(exceptions, name).outcome_unknown] == [
        "HalfOutcomeUnknownError", "WriteOutcomeUnknownError"]
    assert issubclass(WriteOutcomeUnknownError, StorageUnavailableError)
    assert not issubclass(HalfOutcomeUnknownError, StorageUnavailableError)  # the producer's, caught apart
    assert issubclass(HalfOutcomeUnknownError, CoordinatorError)
