"""A chaos run's report, printed: what the harness did, the outcomes by kind, the hostile records' fates
and the violations found."""

from __future__ import annotations

import json

__all__ = ["print_report"]


def print_report(report: dict) -> None:
    did, found = report["did"], report["found"]
    print()
    print("did")
    rows = [(f"transactions: {kind}", count) for kind, count in sorted(did["transactions_by_kind"].items())]
    rows += [("checker kills (SIGKILL, process group)", len(did["checker_kills"])),
             ("checker starts", did["checker_starts"]),
             ("failover after each checker kill (s)", ", ".join(str(f["failover_s"]) for f in did["failovers"]) or "-"),
             ("producer kills (SIGKILL)", len(did["producer_kills"])),
             ("producer restarts", did["producer_restarts"]),
             ("maintenance runs", did["maintenance_runs"]),
             ("maintenance errors", len(did["maintenance_errors"])),
             ("maintenance: files compacted away / vacuumed",
              f"{did['maintenance_files_compacted']} / {did['maintenance_files_vacuumed']}"),
             ("bad inputs", len(did["bad_inputs"])),
             ("poisons written (rounds) / refused with their reason",
              f"{len(did['poisonings'])} ({did['poison_rounds']}) / {sum(1 for p in did['poisonings'] if p['reason'])}"),
             ("maintenance runs that reported the poisoned log and went on", did["maintenance_poisoned_failures"]),
             ("discarded, then committed by an operator (COMMITs accepted / refused as too late)",
              f"{did['operator_recoveries']} ({did['operator_commits_sent']} / {did['operator_commits_refused']})"),
             *_consumer_rows(did.get("consumers") or {}),
             ("settled (every half resolved, then the consumer group caught up: s after the start)",
              f"{did['settled']} ({did.get('halves_resolved_s')}, {did.get('consumers_caught_up_s')})"),
             ("duration (s)", did["duration_s"])]
    if did["storage_faults"] is not None:
        faults = did["storage_faults"]
        rows += [("storage requests (through the fault proxy, until the faults stopped)", faults["requests"])]
        rows += [(f"storage faults: {kind}", count) for kind, count in faults["injected"].items()]
        rows += [(f"storage, in the processes' logs: {what}", count) for what, count in faults["seen_in_logs"].items()]
    _print_rows(rows)
    print("outcomes by kind")
    _print_rows([(kind, json.dumps(counts) if isinstance(counts, dict) else counts)
                 for kind, counts in report["outcomes_by_kind"].items()])
    print("bad inputs → system/rejected")
    _print_rows([(bad["what"], bad["reason"] or "NOT RECORDED") for bad in did["bad_inputs"]])
    if did["poisonings"]:
        print("poisons → system/rejected (one of each kind)")
        first = {poisoning["what"]: poisoning for poisoning in reversed(did["poisonings"])}
        _print_rows([(what, poisoning["reason"] or "NOT REFUSED") for what, poisoning in first.items()])
    print("found (all must be 0)")
    _print_rows(list(found.items()))
    for name, examples in report["examples"].items():
        for example in examples:
            print(f"  {name}: {example}")
    print(f"violations: {report['violations']}")


def _consumer_rows(consumers: dict) -> list[tuple[str, object]]:
    if not consumers.get("consumer_processes"):
        return []
    rows = [("consumer processes / kills (SIGKILL) / restarts",
             f"{consumers['consumer_processes']} / {len(consumers['consumer_kills'])} / {consumers['consumer_restarts']}")]
    rows += [(f"consumer pause (SIGSTOP) {number + 1}",
              f"consumer-{pause['consumer']} {pause['aim']}, {pause['windows']} liveness windows: stopped "
              f"{pause['stopped_s']} s; calls running {len(pause['calls_running'])}; others' calls meanwhile "
              f"{pause['others_calls_meanwhile']}, of {len(pause['taken_over'])} message(s) it had called (taken over)")
             for number, pause in enumerate(consumers["consumer_pauses"])]
    rows += [(f"consumer group reset {number + 1} (after {reset['after_deliveries']} deliveries)",
              "; ".join(f"{topic['topic']} --to {topic['to']}: version {topic['version']}, epoch {topic['epoch']}"
                        for topic in reset["topics"]) + f" (the group stopped {reset['stopped_s']} s; "
              f"{reset['applied_before']} applied and {reset['dead_letters_before']} dead letters before it; "
              f"{len(reset['counted_handled'])} counted handled by their share's progress, neither)")
             for number, reset in enumerate(consumers["consumer_resets"])]
    rows += [(f"dead-letter round {number + 1} (after {round_['after_deliveries']} deliveries)",
              f"{round_['open']} open: {len(round_['redriven'])} redriven, {len(round_['discarded'])} discarded, "
              f"{round_['left_open']} left open") for number, round_ in enumerate(consumers["dead_letter_rounds"])]
    rows += [("consumer deliveries (of messages applied, delivered again / of the failing kind, attempts)",
              f"{consumers['deliveries']} ({consumers['delivered_again']} / {consumers['deliveries_of_failing']})"),
             ("consumer effects applied / dead letters (open)",
              f"{consumers['applied']} / {consumers['dead_letters']} ({consumers['dead_letters_open']})"),
             ("what became of each message", json.dumps(consumers["fates"], sort_keys=True)),
             ("calls that skipped a message applied already (by processes started after the last reset)",
              consumers["skipped_after_reset"]),
             ("gaps the instances reported in the proof of their hold (s), the pauses among them",
              ", ".join(map(str, consumers["instance_gaps"])) or "-"),
             ("overlapping calls of a key across a pause (past the successor's first call)",
              f"{consumers['overlaps_across_a_pause']} ({consumers['overlaps_past_the_successors_first_call']})"),
             ("keys whose effects were in order (topic, key)", consumers["keys_in_order"])]
    return rows


def _print_rows(rows: list[tuple[str, object]]) -> None:
    width = max((len(name) for name, _ in rows), default=0)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
