"""Coordinator configuration: a TOML file, each key overridable by ``TXCOORD_<KEY>``."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Optional

from coordinator.exceptions import ConfigError
from coordinator.grants import TopicGrants
from coordinator.storage import is_object_store

__all__ = ["CoordinatorConfig", "DEFAULT_CONFIG_PATH", "DEFAULT_RETRY_DELAYS_MS", "ENV_PREFIX", "EXIT_USAGE",
           "MAX_CONSUMER_BUFFERED", "POSITION_GONE_CHOICES", "START_CHOICES", "parse_start_time"]

DEFAULT_CONFIG_PATH = Path("conf") / "coordinator.toml"
ENV_PREFIX = "TXCOORD_"
#: The exit status of every command and job started with bad arguments or a bad configuration.
EXIT_USAGE = 2
#: The values of ``rebuild_in_spark``.
REBUILD_CHOICES = ("auto", "always", "never")
#: Where a consumer group reading a topic for the first time starts, besides an ISO time.
START_CHOICES = ("earliest", "latest")
#: What a consumer's share does when a version it needs is gone (``consumer_position_gone``).
POSITION_GONE_CHOICES = ("earliest", "latest", "fail")
#: The most messages a share may buffer (``consumer_max_buffered``): what bounds its progress record.
MAX_CONSUMER_BUFFERED = 50_000
#: RocketMQ's retry ladder (messageDelayLevel 3 to 18): the delay before each attempt after a failed one.
DEFAULT_RETRY_DELAYS_MS = (10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000, 480_000,
                           540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000)
#: The integer settings that may be below 1 (each one's least value); every other is at least 1.
_LEAST = {"maintenance_interval_ms": 0, "metrics_record_interval_ms": 0}


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings shared by producers and the checker (defaults: RocketMQ's).

    ``lakehouse`` is the directory that holds every table (a relative path is
    taken from the current directory), or an object-storage location,
    ``s3://bucket/prefix`` or ``abfss://container@account.dfs.core.windows.net/prefix``.
    ``storage`` holds what reaching it takes (the TOML's ``[storage]`` table: ``object_store``'s
    keys such as ``aws_endpoint``, ``aws_region``, ``aws_allow_http``, or on Azure
    ``azure_storage_account_key``, ``azure_storage_endpoint``; ``AWS_*`` or ``AZURE_*``
    environment variables fill in the rest).

    Example::

        config = CoordinatorConfig.load("conf/coordinator.toml")
        config.transaction_check_max  # 15
        CoordinatorConfig(lakehouse="/tmp/lh", transaction_timeout_ms=1000)
    """

    lakehouse: str = "lakehouse"
    transaction_timeout_ms: int = 6000
    transaction_check_interval_ms: int = 60000
    transaction_check_max: int = 15
    file_reserved_time_hours: int = 72
    trigger_interval_ms: int = 100
    checker_lease_ttl_ms: int = 30000
    commit_interval_ms: int = 10
    producer_heartbeat_ms: int = 2000
    storage: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)  # may hold credentials
    #: The TOML's ``[topic_grants]``: producer group -> topics it may publish to (:mod:`coordinator.grants`);
    #: None, the default, when the TOML has no such table: grants off.
    topic_grants: Optional[Mapping[str, tuple[str, ...]]] = None
    #: The checker serves its Prometheus metrics at ``http://metrics_host:metrics_port/metrics``; None, the
    #: default: not served. 0 takes any free port (the checker logs which).
    metrics_port: Optional[int] = None
    #: Where the metrics are served: this host only unless told otherwise (``0.0.0.0``: every interface).
    metrics_host: str = "127.0.0.1"
    #: The checker appends its batches' rows to ``system/metrics`` at most this often, the batches ended
    #: meanwhile in one commit (an idle checker ends one a second); 0: after every batch.
    metrics_record_interval_ms: int = 5000
    #: Where a checker rebuilding its pending set runs the ``half ⋈̸ op`` anti-join: ``auto`` (Spark on a
    #: cluster for a large unresolved range, else the driver), ``always`` (Spark) or ``never`` (the driver).
    rebuild_in_spark: str = "auto"
    #: The checker job maintains every table (:mod:`coordinator.jobs.maintenance`, ``txcoord maintain``'s work)
    #: this long after the end of its last run, while it holds the lease; 0: never (run ``txcoord maintain``).
    maintenance_interval_ms: int = 300000
    #: That maintenance's vacuum retention (``txcoord maintain --retention-hours``): at least 1.
    maintenance_retention_hours: int = 168
    #: That maintenance's log retention (``txcoord maintain --log-retention-hours``, fractions allowed); None,
    #: the default: each table keeps its own (Delta's default: 30 days).
    maintenance_log_retention_hours: Optional[float] = None
    #: Where a consumer group starts on a topic it has never read (:mod:`coordinator.consumer`): ``earliest``
    #: (the default: every message the topic holds), ``latest`` (only what arrives after) or an ISO time with its
    #: zone (the first version committed at or after it). Fixed once, at the group's first start on the topic.
    consumer_start_from: str = "earliest"
    #: The delay before each new attempt of a message that failed, in order; the last one repeats.
    consumer_retry_delays_ms: tuple[int, ...] = DEFAULT_RETRY_DELAYS_MS
    #: Attempts of one message (the first included) before it moves to the group's dead letters.
    consumer_max_attempts: int = 16
    #: A listener call running longer counts as failed; its thread is abandoned, another takes its place.
    consumer_timeout_ms: int = 900_000
    #: Each consumer instance announces itself this often; one silent for two heartbeats is taken for dead.
    #: 3 s, not 2: on S3 the record's PUT is most of what an idle instance costs a day, and at 2 s it took
    #: nearly all of the budget by itself (the figures: docs/performance-log.md#consumers).
    consumer_heartbeat_ms: int = 3000
    #: Listener calls one consumer instance runs at once (messages of different keys).
    consumer_threads: int = 8
    #: How often a consumer looks for new versions of its topics.
    consumer_poll_interval_ms: int = 100
    #: A share's progress is saved at most this often while messages succeed (a failure is saved at once).
    consumer_commit_interval_ms: int = 5000
    #: Messages one share reads ahead of its oldest unfinished one (at most MAX_CONSUMER_BUFFERED): its progress
    #: record lists at most these.
    consumer_max_buffered: int = 1000
    #: What a share does when a version it needs is gone (log cleanup, vacuum): ``earliest`` (the default) reads
    #: what the topic still holds from its snapshot, from the batch it had reached; ``latest`` moves past every
    #: message now; ``fail`` stops the share with the error (docs/consumer.md#positions-and-maintenance).
    consumer_position_gone: str = "earliest"
    #: A consumer process serves its own Prometheus metrics at ``http://metrics_host:consumer_metrics_port/metrics``
    #: (0: any free port); None, the default: it serves none.
    consumer_metrics_port: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.lakehouse, str) or not self.lakehouse.strip():
            raise ConfigError(f"lakehouse must be a non-empty path, got {self.lakehouse!r}")
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", self.lakehouse)
        if scheme and not is_object_store(self.lakehouse):
            # Else "gs://b/lh" would quietly become a local directory named "gs:".
            raise ConfigError(f"lakehouse {self.lakehouse!r}: {scheme.group(1)}:// is not supported; a lakehouse is a "
                              "local path, on S3-compatible storage (s3://bucket/prefix) or on Azure "
                              "(abfss://container@account.dfs.core.windows.net/prefix). GCS is readable from Spark "
                              "only: see README, \"Deploying on S3, ADLS or GCS\"")
        if not isinstance(self.storage, Mapping) or not all(isinstance(key, str) for key in self.storage):
            raise ConfigError(f"storage must be a table of settings ([storage] in the TOML), got {self.storage!r}")
        object.__setattr__(self, "storage", {key: _setting(value) for key, value in self.storage.items()})
        if self.topic_grants is not None:
            object.__setattr__(self, "topic_grants", TopicGrants.parse(self.topic_grants))
        for name in ("metrics_port", "consumer_metrics_port"):
            port = getattr(self, name)
            if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
                raise ConfigError(f"{name} must be a TCP port (0 to 65535; 0: any free one), got {port!r}")
        if not isinstance(self.metrics_host, str) or not self.metrics_host.strip():
            raise ConfigError(f"metrics_host must be a host name or address, got {self.metrics_host!r}")
        if self.rebuild_in_spark not in REBUILD_CHOICES:
            raise ConfigError(f"rebuild_in_spark must be one of {', '.join(REBUILD_CHOICES)}, got {self.rebuild_in_spark!r}")
        hours = self.maintenance_log_retention_hours
        if hours is not None and (isinstance(hours, bool) or not isinstance(hours, (int, float))
                                  or not (math.isfinite(hours) and hours > 0)):
            raise ConfigError(f"maintenance_log_retention_hours must be a positive number of hours, got {hours!r}")
        _check_consumer_settings(self)
        for f in dataclasses.fields(self):
            if f.type != "int":
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{f.name} must be an integer, got {value!r}")
            if value < _LEAST.get(f.name, 1):
                raise ConfigError(f"{f.name} must be at least {_LEAST.get(f.name, 1)}, got {value}")

    @classmethod
    def load(cls, path: Optional[os.PathLike | str] = None, environ: Optional[Mapping[str, str]] = None) -> "CoordinatorConfig":
        """Read a TOML file (default ``conf/coordinator.toml``), then apply ``TXCOORD_*`` overrides.

        A missing default file means "all defaults"; a missing file that was
        named explicitly is an error, as are unknown keys and bad values.

        Example::

            # conf/coordinator.toml:  lakehouse = "/data/lh"
            # environment:            TXCOORD_TRANSACTION_CHECK_MAX=5
            CoordinatorConfig.load().transaction_check_max  # 5
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        file = Path(path) if path is not None else DEFAULT_CONFIG_PATH
        if file.exists():
            try:
                values = tomllib.loads(file.read_text())
            except tomllib.TOMLDecodeError as error:
                raise ConfigError(f"{file}: not valid TOML: {error}") from error
        elif path is not None:
            raise ConfigError(f"configuration file {file} does not exist")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"{file}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(known)}")
        for name, f in known.items():
            variable = ENV_PREFIX + name.upper()
            if variable in environ and f.type in ("int", "str", "Optional[int]", "Optional[float]"):  # [storage]: AWS_* instead
                values[name] = _parse_env(variable, environ[variable], f.type.removeprefix("Optional[").rstrip("]"))
            elif variable in environ and f.type == "tuple[int, ...]":  # a list: comma-separated integers
                values[name] = tuple(_parse_env(variable, item, "int") for item in environ[variable].split(","))
        return cls(**values)

    def replace(self, **changes: Any) -> "CoordinatorConfig":
        """A copy with some settings changed.

        Example::

            fast = config.replace(transaction_timeout_ms=500)
        """
        return dataclasses.replace(self, **changes)


def _check_consumer_settings(config: CoordinatorConfig) -> None:
    start = config.consumer_start_from
    if not isinstance(start, str) or (start not in START_CHOICES and parse_start_time(start) is None):
        raise ConfigError(f"consumer_start_from must be earliest, latest or an ISO time with its zone "
                          f"(2025-06-01T00:00:00+00:00), got {start!r}")
    delays = config.consumer_retry_delays_ms
    if isinstance(delays, (str, bytes)) or not isinstance(delays, (list, tuple)) or not delays or not all(
            isinstance(delay, int) and not isinstance(delay, bool) and delay >= 0 for delay in delays):
        raise ConfigError(f"consumer_retry_delays_ms must be a non-empty list of milliseconds (each at least 0), "
                          f"got {delays!r}")
    object.__setattr__(config, "consumer_retry_delays_ms", tuple(delays))
    if config.consumer_position_gone not in POSITION_GONE_CHOICES:
        raise ConfigError(f"consumer_position_gone must be one of {', '.join(POSITION_GONE_CHOICES)}, "
                          f"got {config.consumer_position_gone!r}")
    buffered = config.consumer_max_buffered
    if isinstance(buffered, bool) or not isinstance(buffered, int) or not 1 <= buffered <= MAX_CONSUMER_BUFFERED:
        raise ConfigError(f"consumer_max_buffered must be 1 to {MAX_CONSUMER_BUFFERED}, got {buffered!r}")


def parse_start_time(text: str) -> Optional[datetime]:
    """``text`` as an ISO time with its zone (``consumer_start_from``, ``--to``), or ``None``.

    Example::

        parse_start_time("2025-06-01T00:00:00Z")  # datetime(2025, 6, 1, tzinfo=timezone.utc)
        parse_start_time("2025-06-01")            # None: no zone
    """
    try:
        when = datetime.fromisoformat(text.strip())
    except (ValueError, AttributeError):
        return None
    return when if when.tzinfo is not None else None


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    raise ConfigError(f"a [storage] setting is a string, a number or a boolean, got {value!r}")


def _parse_env(variable: str, raw: str, kind: str) -> Any:
    if kind == "str":
        return raw
    try:
        return float(raw.strip()) if kind == "float" else int(raw.strip())
    except ValueError:
        raise ConfigError(f"{variable} must be {'a number' if kind == 'float' else 'an integer'}, got {raw!r}") from None
