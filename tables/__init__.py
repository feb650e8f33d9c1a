"""Every table of the lakehouse: its path and its schema, defined once.

Both engines use these definitions: producers (delta-rs, no JVM) through
:func:`TableDef.arrow_schema`, the checker (Spark) through
:func:`TableDef.spark_ddl`. Imported as ``coordinator.tables``.

Types are written in Spark's DDL spelling and limited to what both engines
read and write without extra table features: timestamps are time-zone aware
(``timestamp`` is UTC in both), so no table ever needs ``timestampNtz``
(delta-rs issue #2882).

Where each table lives under a lakehouse is :class:`coordinator.lakehouse.Lakehouse`'s to say.

Example::

    from coordinator.tables import COMMIT_LOG
    COMMIT_LOG.name                          # 'groups/<GROUP>/commit_log'
    COMMIT_LOG.arrow_schema().names[:2]      # ['record_id', 'kind']
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

_ARROW_TYPES = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "map<string,string>": pa.map_(pa.string(), pa.string()),
    "map<string,long>": pa.map_(pa.string(), pa.int64()),
}


@dataclass(frozen=True)
class TableDef:
    """A Delta table of the lakehouse: its name (where it lives under the lakehouse) and what it holds.

    ``columns`` is an ordered tuple of ``(name, type)`` with ``type`` in
    Spark DDL spelling. Every column is nullable: the commit log accepts
    whatever a writer sends and the checker refuses bad rows itself, and the
    checker's own tables gain no constraint that delta-rs would have to know.
    """

    name: str
    columns: tuple[tuple[str, str], ...]
    properties: dict[str, str] = field(default_factory=dict)
    #: Each file's rows by slot, for the consumers that read a share of each (``coordinator.lakehouse.slots``).
    by_slot: bool = False

    @property
    def column_names(self) -> list[str]:
        """The column names, in order."""
        return [name for name, _ in self.columns]

    def arrow_schema(self) -> pa.Schema:
        """The schema as a pyarrow schema, for delta-rs.

        Example::

            COMMIT_LOG.arrow_schema().field("body").type  # DataType(binary)
        """
        return pa.schema([pa.field(name, _ARROW_TYPES[kind], nullable=True) for name, kind in self.columns])

    def spark_ddl(self) -> str:
        """The schema as a Spark DDL string, for ``spark.createDataFrame`` or ``.schema()``.

        Example::

            spark.createDataFrame([], OP.spark_ddl())
        """
        return ", ".join(f"`{name}` {kind}" for name, kind in self.columns)


_MESSAGE = (
    ("transaction_id", "string"),
    ("producer_group", "string"),
    ("msg_id", "string"),
    ("message_index", "int"),
    ("message_count", "int"),
    ("topic", "string"),
    ("keys", "string"),
    ("tags", "string"),
    ("properties", "map<string,string>"),
    ("body", "binary"),
    ("born_timestamp", "timestamp"),
)

#: A message's own columns: what travels with it from the half queue to check requests, discards and topics.
MESSAGE_FIELDS = tuple(name for name, _ in _MESSAGE
                       if name not in ("transaction_id", "producer_group", "message_index", "message_count"))


def _message_columns(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The columns of :data:`_MESSAGE` that ``names`` names, in their order there: every table spells a
    message's columns as the commit log does."""
    return tuple(column for column in _MESSAGE if column[0] in names)


#: Whose a row is: its transaction and the producer group that sent it.
_TRANSACTION = _message_columns(("transaction_id", "producer_group"))
#: The message itself (:data:`MESSAGE_FIELDS`).
_MESSAGE_OWN = _message_columns(MESSAGE_FIELDS)

#: Everything a producer group sends: HALF records (prepared messages) and END records
#: (the outcome of a local transaction, from the producer or answering a check), in the group's
#: own log; operators' decisions go to ``operators/commit_log``, of the same schema
#: (``coordinator.commit_logs``). Append-only. The checker reads each version's added files
#: straight from the log (``coordinator.checker.segment``); the change data feed stays on for other readers.
#: Producers commit to it many times a second and maintenance compacts its files as often, so its
#: checkpoints come every 1,000 commits (not Delta's 100) and keep a removed file's tombstone for 2
#: minutes (not a week): every checkpoint carries the compactions' tombstones of that retention, which grew
#: each checkpoint for a week, and with 10 minutes still for 10 minutes
#: (docs/performance-log.md#figures-quoted-elsewhere-before,
#: docs/performance-log.md#the-checkers-own-maintenance-is-each-commit-logs-_delta_log-bounded). The checker never reads
#: a commit log through a snapshot, and maintenance vacuums it by listing (``coordinator.ops.maintenance``).
#: No writer cleans its log after a commit: only maintenance does, once the checker no longer needs a commit.
COMMIT_LOG = TableDef(
    "groups/<GROUP>/commit_log",
    (
        ("record_id", "string"),
        ("kind", "string"),
        *_MESSAGE,
        ("state", "string"),
        ("check_id", "string"),
    ),
    {"delta.enableChangeDataFeed": "true", "delta.appendOnly": "true", "delta.checkpointInterval": "1000",
     "delta.deletedFileRetentionDuration": "interval 2 minutes", "delta.enableExpiredLogCleanup": "false"},
)

#: The half queue: each accepted half message with its queue offset.
HALF = TableDef(
    "system/half",
    (
        ("queue_offset", "long"),
        *_MESSAGE,
        ("stored_timestamp", "timestamp"),
        ("immunity_ms", "long"),
        ("commit_version", "long"),
        ("batch_id", "long"),
    ),
)

#: The op queue: one row per resolved half, keyed by its half queue offset. A discarded half that an
#: operator committed afterwards has a second row, its ``COMMIT`` (``coordinator.checker.recover``).
OP = TableDef(
    "system/op",
    (
        ("half_offset", "long"),
        *_TRANSACTION,
        ("outcome", "string"),
        ("resolved_at", "timestamp"),
        ("end_record_id", "string"),
        ("check_id", "string"),
        ("batch_id", "long"),
    ),
)

#: One row per check-back sent to a producer group, in the group's own table
#: (``groups/<GROUP>/check_requests``, which only that group reads): it carries the transaction's
#: first message so the producer can answer without reading the half queue. The checker keeps its
#: own record of every check in ``system/check_requests``, of the same schema, without the
#: message's content (``keys``, ``tags``, ``properties`` and ``body`` are null there).
GROUP_CHECK_REQUESTS = TableDef(
    "groups/<GROUP>/check_requests",
    (
        ("check_id", "string"),
        *_TRANSACTION,
        ("check_times", "int"),
        ("requested_at", "timestamp"),
        ("half_offset", "long"),
        *_MESSAGE_OWN,
        ("batch_id", "long"),
        # The live producer instance of the group this check is addressed to; null: any of them.
        ("producer_instance", "string"),
    ),
    {"delta.enableChangeDataFeed": "true"},
)

#: The checker's record of every check it sent: see :data:`GROUP_CHECK_REQUESTS`.
CHECK_REQUESTS = TableDef("system/check_requests", GROUP_CHECK_REQUESTS.columns)

#: The columns a check request carries only to its group: the message's content.
MESSAGE_CONTENT = ("keys", "tags", "properties", "body")

#: Halves given up: checked the maximum number of times, or past retention.
DISCARDED = TableDef(
    "system/discarded",
    (
        *_TRANSACTION,
        ("half_offset", "long"),
        *_MESSAGE_OWN,
        ("stored_timestamp", "timestamp"),
        ("check_times", "int"),
        ("reason", "string"),
        ("discarded_at", "timestamp"),
        ("batch_id", "long"),
    ),
)

#: Every commit-log record the checker refused, with the reason.
REJECTED = TableDef(
    "system/rejected",
    (
        ("record_id", "string"),
        ("kind", "string"),
        *_message_columns(("transaction_id", "producer_group", "msg_id", "topic")),
        ("state", "string"),
        ("check_id", "string"),
        ("reason", "string"),
        ("commit_version", "long"),
        ("stored_timestamp", "timestamp"),
        ("batch_id", "long"),
        # Where the record was stored: the commit log it came from, which says who wrote it.
        ("commit_log", "string"),
    ),
)

#: What the checker read of each commit-log version, so that a commit rewritten since shows
#: (docs/design.md#hostile-input): the sha256 of the commit file's exact bytes and its size, one row per
#: transaction whose records the commit held (``transaction_id`` null for a commit refused whole; one per run of
#: its records, should a commit hold a transaction's records apart), written
#: once per batch with the batch's other tables. ``txcoord inspect`` reads the file again and compares.
#: A commit that adds no records (a compaction's) holds no transaction's and has no row.
COMMITS_READ = TableDef(
    "system/commits_read",
    (
        ("commit_log", "string"),
        ("commit_version", "long"),
        ("transaction_id", "string"),
        ("sha256", "string"),
        ("bytes", "long"),
        ("stored_timestamp", "timestamp"),  # when the version entered its log, as the checker read it
        ("batch_id", "long"),
    ),
)

#: A real topic: committed messages, visible to consumers and analysts. Checkpointed every 20 commits (not
#: Delta's 100): a consumer group's lag is counted from the newest checkpoint's statistics and each commit after
#: it, one read a commit (docs/performance-log.md#a-consumer-groups-lag-at-a-million-messages-issue-59-point-6-2026-12-06).
TOPIC = TableDef(
    "topics/<TOPIC>",
    (
        *_message_columns(("transaction_id",)),
        *_MESSAGE_OWN,
        ("commit_timestamp", "timestamp"),
        ("queue_offset", "long"),
        ("batch_id", "long"),
    ),
    {"delta.checkpointInterval": "20"},
    by_slot=True,
)

#: Committed messages whose topic could not be written when they were decided: their delivery is
#: withheld, and so are their op rows, until the topic takes them (docs/design.md#a-topic-that-cannot-be-written).
#: One row per message: the topic row it will get, the op row's columns, the reason; written once, by the batch
#: that first tried (``batch_id``), and delivered once the topic records that batch or a later one of the checker's.
UNDELIVERED = TableDef(
    "system/undelivered",
    (
        ("half_offset", "long"),
        *(column for column in TOPIC.columns if column[0] not in ("queue_offset", "batch_id")),
        ("producer_group", "string"),
        ("resolved_at", "timestamp"),
        ("end_record_id", "string"),
        ("check_id", "string"),
        ("reason", "string"),
        ("batch_id", "long"),
    ),
)

#: One row per checker micro-batch, written by the checker's metrics listener
#: (``coordinator.checker.metrics``): how long it took, what came in, what it decided.
METRICS = TableDef(
    "system/metrics",
    (
        ("batch_id", "long"),
        ("started_at", "timestamp"),  # when the trigger fired
        ("finished_at", "timestamp"),  # when the batch had committed every write
        ("duration_ms", "long"),  # the whole trigger: planning, the batch, committing offsets
        ("input_rows", "long"),  # rows read: the batch's records and its clock tick
        ("records", "long"),  # commit-log records
        ("halves", "long"),  # halves ingested
        ("commits", "long"),  # transactions committed
        ("rollbacks", "long"),  # transactions rolled back
        ("delivered", "long"),  # messages written to topics
        ("checks", "long"),  # check requests sent
        ("discarded", "long"),  # halves discarded
        ("rejected", "long"),  # records refused
        ("pending_halves", "long"),  # halves with no op row once the batch had committed
        ("commit_log_version", "long"),  # how many commit-log versions the checker had read, over every log
        # Per topic: messages written, and their commit->visible latency (the COMMIT entering the commit log to the
        # topic row written) at the median and the 99th percentile. What the console charts per topic over time.
        ("delivered_by_topic", "map<string,long>"),
        ("visible_p50_ms_by_topic", "map<string,long>"),
        ("visible_p99_ms_by_topic", "map<string,long>"),
    ),
)

#: The checker's tables, which ``txcoord init`` creates. Topic tables appear on first delivery;
#: a group's tables when it is added (``txcoord add-group``) or first sends.
SYSTEM_TABLES = (HALF, OP, CHECK_REQUESTS, DISCARDED, REJECTED, UNDELIVERED, COMMITS_READ, METRICS)


#: A consumer group's dead letters (``consumers/<GROUP>/dead_letters``), written by the group's instances only:
#: one row each time a message used up ``consumer_max_attempts``, with the message, its last error and how many
#: attempts it had. ``dead_letter_id`` (``<source>.<version>.<queue offset>.<msg id>.<epoch>``: where the message
#: was read and the source's resets so far) is what an operator's action names; written once whoever writes it; a
#: message redriven, or delivered again after a reset, and dead again gets a new row and a new id.
DEAD_LETTERS = TableDef(
    "consumers/<GROUP>/dead_letters",
    (
        ("dead_letter_id", "string"),
        *TOPIC.columns[:-1],  # the message as its topic holds it, less the checker's batch id
        ("topic_version", "long"),  # the topic table's version the message arrived in (-1: a redrive)
        ("share", "int"),
        ("attempts", "int"),
        ("last_error", "string"),
        ("dead_at", "timestamp"),
        ("consumer_instance", "string"),
    ),
)

#: What operators did to a consumer group (``consumers/<GROUP>/operator_actions``), written by operators only
#: (``txcoord dead-letters``, ``txcoord consumer-groups reset``): who (``operator``) did what, when and why. A
#: ``REDRIVE`` or ``DISCARD`` closes the dead letter it names; a ``RESET`` names the topic and where it went.
CONSUMER_ACTIONS = TableDef(
    "consumers/<GROUP>/operator_actions",
    (
        ("action_id", "string"),
        ("action", "string"),
        ("dead_letter_id", "string"),
        ("msg_id", "string"),
        ("topic", "string"),
        ("detail", "string"),
        ("operator", "string"),
        ("acted_at", "timestamp"),
    ),
)

#: Messages operators redrive to a consumer group (``consumers/<GROUP>/redrive``), written by operators only: a
#: topic's rows (``topic`` the original one), consumed by the group like one more topic of its own
#: (RocketMQ's ``%RETRY%<group>``), attempts counted afresh.
REDRIVE = TableDef("consumers/<GROUP>/redrive", TOPIC.columns)
