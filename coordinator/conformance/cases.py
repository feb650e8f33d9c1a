"""The kit's cases, in the order it lists and reports them (docs/protocol.md#the-cases), and which to run.

Every case module sits below this list and above :mod:`.primitives`; the runner (:mod:`.kit`) sits above it
(tests/test_layering.py). A case uses a producer group of its own, ``conformance_<case>``. The cases run
concurrently against one checker (:func:`~coordinator.conformance.kit.run_cases`): a case judges only its own
transactions (by id: the topics are shared), its own group's halves, instance records and refusals (those of
records stored under its group's directory), never a table as a whole.

Example::

    chosen_cases(["commit", "grant"], object_store=True)   # {'commit': case_commit, 'grant': case_grant}
"""

from __future__ import annotations

from typing import Iterable, Optional

from coordinator.conformance.basic import (case_check_commit, case_check_rollback, case_commit, case_crash_after_half,
                                           case_heartbeat_routing, case_late_end, case_multi_topic, case_name_rule,
                                           case_rollback, case_size_limit)
from coordinator.conformance.checkpointed import case_checkpointed_log
from coordinator.conformance.grant import case_grant
from coordinator.conformance.malformed import case_malformed_neighbour
from coordinator.conformance.numbering import case_log_numbering
from coordinator.conformance.primitives import Case
from coordinator.conformance.storage_faults import case_lost_reply, case_slow_reply, case_throttled, case_unknown_outcome
from coordinator.conformance.versioning import case_protocol_version
from coordinator.exceptions import ConformanceKitError

__all__ = ["CASES", "OBJECT_STORE_CASES", "SLOWEST", "chosen_cases", "start_order"]

CASES: dict[str, Case] = {
    "commit": case_commit,
    "rollback": case_rollback,
    "check_commit": case_check_commit,
    "check_rollback": case_check_rollback,
    "multi_topic": case_multi_topic,
    "crash_after_half": case_crash_after_half,
    "late_end": case_late_end,
    "size_limit": case_size_limit,
    "name_rule": case_name_rule,
    "heartbeat_routing": case_heartbeat_routing,
    "malformed_neighbour": case_malformed_neighbour,
    "checkpointed_log": case_checkpointed_log,
    "log_numbering": case_log_numbering,
    "protocol_version": case_protocol_version,
}
#: The cases only a lakehouse on the S3 server, with an account per group and the storage-fault proxy, can run.
OBJECT_STORE_CASES: dict[str, Case] = {
    "grant": case_grant,
    "lost_reply": case_lost_reply,
    "throttled": case_throttled,
    "unknown_outcome": case_unknown_outcome,
    "slow_reply": case_slow_reply,
}


def chosen_cases(names: Iterable[str], object_store: bool) -> dict[str, Case]:
    """The cases to run, in the kit's order: ``names`` (all if none); :class:`ConformanceKitError` for an unknown name or an
    object-store case without ``object_store``."""
    available = CASES | (OBJECT_STORE_CASES if object_store else {})
    wanted: Optional[set[str]] = set(names) or None
    if wanted is not None:
        unknown = sorted(wanted - set(CASES) - set(OBJECT_STORE_CASES))
        if unknown:
            raise ConformanceKitError(f"no case {', '.join(unknown)}; the cases: {', '.join([*CASES, *OBJECT_STORE_CASES])}")
        if wanted - set(available):
            raise ConformanceKitError(f"case(s) {', '.join(sorted(wanted - set(available)))} need --object-store")
    return {name: case for name, case in available.items() if wanted is None or name in wanted}


#: The cases that wait longest (for immunities and checks), slowest first: started first when the cases run
#: concurrently, so that the run ends with the quick ones, not with one of these alone.
SLOWEST = ("slow_reply", "late_end", "unknown_outcome", "crash_after_half", "heartbeat_routing", "check_commit",
           "check_rollback")


def start_order(cases: Iterable[str]) -> list[str]:
    """``cases`` in the order to start them: :data:`SLOWEST` first, then the others in the kit's order."""
    names = list(cases)
    return sorted(names, key=lambda name: (SLOWEST.index(name) if name in SLOWEST else len(SLOWEST), names.index(name)))
