package io.txcoord.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.dataformat.toml.TomlMapper;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The coordinator's settings: the same TOML file the Python producer and the checker read
 * ({@code conf/coordinator.toml}), each top-level key overridable by the environment variable
 * {@code TXCOORD_<KEY>}. The client uses {@code lakehouse} (a local directory or {@code s3://bucket/prefix}),
 * {@code [storage]} (how to reach S3: {@code aws_endpoint}, {@code aws_region}, {@code aws_access_key_id},
 * {@code aws_secret_access_key}, {@code aws_allow_http}, {@code max_retries}, {@code retry_timeout}, {@code timeout}; the
 * {@code AWS_*} environment fills in what is missing), {@code commit_interval_ms},
 * {@code producer_heartbeat_ms}, {@code transaction_check_interval_ms} and {@code [topic_grants]}; it accepts
 * and ignores the checker's and consumers' keys, and refuses unknown ones, as the Python client does.
 *
 * <pre>{@code
 * CoordinatorConfig config = CoordinatorConfig.load(Path.of("conf/coordinator.toml"));
 * CoordinatorConfig local = CoordinatorConfig.builder().lakehouse("/tmp/lh").build();
 * }</pre>
 */
public final class CoordinatorConfig {
    /** Every top-level key the coordinator's TOML may have (coordinator/config.py), besides the tables. */
    private static final Set<String> KNOWN_KEYS = Set.of("lakehouse", "transaction_timeout_ms",
            "transaction_check_interval_ms", "transaction_check_max", "file_reserved_time_hours",
            "trigger_interval_ms", "checker_lease_ttl_ms", "commit_interval_ms", "producer_heartbeat_ms", "storage",
            "topic_grants", "metrics_port", "metrics_host", "metrics_record_interval_ms", "rebuild_in_spark",
            "maintenance_interval_ms", "maintenance_retention_hours", "maintenance_log_retention_hours",
            "consumer_start_from", "consumer_retry_delays_ms", "consumer_max_attempts", "consumer_timeout_ms",
            "consumer_heartbeat_ms", "consumer_threads", "consumer_poll_interval_ms", "consumer_commit_interval_ms",
            "consumer_max_buffered", "consumer_position_gone", "consumer_metrics_port");
    private static final Set<String> INT_KEYS = Set.of("transaction_timeout_ms", "transaction_check_interval_ms",
            "transaction_check_max", "commit_interval_ms", "producer_heartbeat_ms");
    private static final Pattern DURATION = Pattern.compile("^\\s*([0-9]+(?:\\.[0-9]+)?)\\s*(ms|s|m|h)?\\s*$");

    private final String lakehouse;
    private final Map<String, String> storage;
    private final int transactionTimeoutMs;
    private final int transactionCheckIntervalMs;
    private final int commitIntervalMs;
    private final int producerHeartbeatMs;
    private final Map<String, List<String>> topicGrants;

    private CoordinatorConfig(Builder b) {
        if (b.lakehouse == null || b.lakehouse.isBlank()) {
            throw new ConfigError("lakehouse must be a non-empty path, got " + b.lakehouse);
        }
        Matcher scheme = Pattern.compile("^([A-Za-z][A-Za-z0-9+.-]*)://").matcher(b.lakehouse);
        if (scheme.find() && !scheme.group(1).equalsIgnoreCase("s3") && !scheme.group(1).equalsIgnoreCase("s3a")
                && !scheme.group(1).equalsIgnoreCase("file")) {
            throw new ConfigError("lakehouse " + b.lakehouse + ": the Java client writes to a local path or to S3 "
                    + "(s3://bucket/prefix), not " + scheme.group(1) + "://");
        }
        this.lakehouse = b.lakehouse;
        this.storage = Collections.unmodifiableMap(new LinkedHashMap<>(b.storage));
        this.transactionTimeoutMs = atLeastOne("transaction_timeout_ms", b.transactionTimeoutMs);
        this.transactionCheckIntervalMs = atLeastOne("transaction_check_interval_ms", b.transactionCheckIntervalMs);
        this.commitIntervalMs = atLeastOne("commit_interval_ms", b.commitIntervalMs);
        this.producerHeartbeatMs = atLeastOne("producer_heartbeat_ms", b.producerHeartbeatMs);
        this.topicGrants = b.topicGrants == null ? null : Collections.unmodifiableMap(new LinkedHashMap<>(b.topicGrants));
        retryTimeoutMs(); // checked now, not at the first retry
        requestTimeoutMs();
        maxRetries();
    }

    private static int atLeastOne(String name, int value) {
        if (value < 1) {
            throw new ConfigError(name + " must be at least 1, got " + value);
        }
        return value;
    }

    /** Reads {@code file} (TOML), then applies {@code TXCOORD_*} overrides from the process's environment. */
    public static CoordinatorConfig load(Path file) {
        return load(file, System.getenv());
    }

    /** Reads {@code file}, then applies the {@code TXCOORD_*} overrides of {@code environ}. */
    public static CoordinatorConfig load(Path file, Map<String, String> environ) {
        if (!Files.exists(file)) {
            throw new ConfigError("configuration file " + file + " does not exist");
        }
        JsonNode root;
        try {
            root = new TomlMapper().readTree(Files.readString(file));
        } catch (IOException e) {
            throw new ConfigError(file + ": not valid TOML: " + e.getMessage(), e);
        }
        List<String> unknown = new ArrayList<>();
        root.fieldNames().forEachRemaining(name -> {
            if (!KNOWN_KEYS.contains(name)) {
                unknown.add(name);
            }
        });
        if (!unknown.isEmpty()) {
            Collections.sort(unknown);
            throw new ConfigError(file + ": unknown key(s) " + String.join(", ", unknown));
        }
        Builder b = builder();
        if (root.has("lakehouse")) {
            b.lakehouse(text(root.get("lakehouse"), "lakehouse"));
        }
        for (String key : INT_KEYS) {
            if (root.has(key)) {
                JsonNode node = root.get(key);
                if (!node.isIntegralNumber()) {
                    throw new ConfigError(key + " must be an integer, got " + node);
                }
                b.setInt(key, node.asInt());
            }
        }
        JsonNode storage = root.get("storage");
        if (storage != null) {
            if (!storage.isObject()) {
                throw new ConfigError("storage must be a table of settings ([storage] in the TOML), got " + storage);
            }
            for (Iterator<Map.Entry<String, JsonNode>> it = storage.fields(); it.hasNext(); ) {
                Map.Entry<String, JsonNode> e = it.next();
                JsonNode v = e.getValue();
                if (!(v.isTextual() || v.isNumber() || v.isBoolean())) {
                    throw new ConfigError("a [storage] setting is a string, a number or a boolean, got " + v);
                }
                b.storage(e.getKey(), v.asText());
            }
        }
        JsonNode grants = root.get("topic_grants");
        if (grants != null) {
            if (!grants.isObject()) {
                throw new ConfigError("topic_grants must be a table of producer group = [topics], got " + grants);
            }
            Map<String, List<String>> parsed = new LinkedHashMap<>();
            for (Iterator<Map.Entry<String, JsonNode>> it = grants.fields(); it.hasNext(); ) {
                Map.Entry<String, JsonNode> e = it.next();
                if (!e.getValue().isArray()) {
                    throw new ConfigError("topic_grants." + e.getKey() + " must be a list of topic names or patterns");
                }
                List<String> topics = new ArrayList<>();
                e.getValue().forEach(t -> topics.add(text(t, "topic_grants." + e.getKey())));
                parsed.put(e.getKey(), topics);
            }
            b.topicGrants(parsed);
        }
        String env = environ.get("TXCOORD_LAKEHOUSE");
        if (env != null) {
            b.lakehouse(env);
        }
        for (String key : INT_KEYS) {
            String variable = "TXCOORD_" + key.toUpperCase();
            if (environ.containsKey(variable)) {
                try {
                    b.setInt(key, Integer.parseInt(environ.get(variable).trim()));
                } catch (NumberFormatException e) {
                    throw new ConfigError(variable + " must be an integer, got " + environ.get(variable));
                }
            }
        }
        return b.build();
    }

    private static String text(JsonNode node, String name) {
        if (!node.isTextual()) {
            throw new ConfigError(name + " must be a string, got " + node);
        }
        return node.asText();
    }

    public static Builder builder() {
        return new Builder();
    }

    /** A builder holding this configuration's settings, to change some. */
    public Builder toBuilder() {
        Builder b = new Builder().lakehouse(lakehouse).transactionTimeoutMs(transactionTimeoutMs)
                .transactionCheckIntervalMs(transactionCheckIntervalMs).commitIntervalMs(commitIntervalMs)
                .producerHeartbeatMs(producerHeartbeatMs).topicGrants(topicGrants);
        storage.forEach(b::storage);
        return b;
    }

    /** The lakehouse root: a local directory or {@code s3://bucket/prefix}. */
    public String getLakehouse() {
        return lakehouse;
    }

    /** The {@code [storage]} settings (may hold credentials: never logged). */
    public Map<String, String> getStorage() {
        return storage;
    }

    public int getTransactionTimeoutMs() {
        return transactionTimeoutMs;
    }

    public int getTransactionCheckIntervalMs() {
        return transactionCheckIntervalMs;
    }

    public int getCommitIntervalMs() {
        return commitIntervalMs;
    }

    public int getProducerHeartbeatMs() {
        return producerHeartbeatMs;
    }

    /** {@code [topic_grants]}: group to topic names or shell patterns; {@code null} when grants are off. */
    public Map<String, List<String>> getTopicGrants() {
        return topicGrants;
    }

    /** Whether the lakehouse is on object storage (S3). */
    public boolean isObjectStore() {
        return lakehouse.regionMatches(true, 0, "s3://", 0, 5) || lakehouse.regionMatches(true, 0, "s3a://", 0, 6);
    }

    /** {@code [storage] max_retries} (default 10): retries of a failed storage request. */
    public int maxRetries() {
        String value = storage.get("max_retries");
        try {
            int n = value == null ? 10 : Integer.parseInt(value.trim());
            if (n < 0) {
                throw new NumberFormatException();
            }
            return n;
        } catch (NumberFormatException e) {
            throw new ConfigError("[storage] max_retries must be a whole number at least 0, got " + value);
        }
    }

    /** {@code [storage] retry_timeout} (default 60 s: "30s", "2m", "500ms" or seconds), in milliseconds. */
    public long retryTimeoutMs() {
        return storageDurationMs("retry_timeout", 60_000);
    }

    /**
     * {@code [storage] timeout} (default 30 s, as object_store's): one request's bound, in milliseconds. A request
     * with no reply by then is given up and, within the retry bound, tried again.
     */
    public long requestTimeoutMs() {
        return storageDurationMs("timeout", 30_000);
    }

    private long storageDurationMs(String key, long defaultMs) {
        String value = storage.get(key);
        if (value == null) {
            return defaultMs;
        }
        Matcher m = DURATION.matcher(value);
        if (!m.matches()) {
            throw new ConfigError("[storage] " + key + " must be a duration such as 60s or 2m, got " + value);
        }
        double n = Double.parseDouble(m.group(1));
        String unit = m.group(2) == null ? "s" : m.group(2);
        double ms = switch (unit) {
            case "ms" -> n;
            case "m" -> n * 60_000;
            case "h" -> n * 3_600_000;
            default -> n * 1000;
        };
        if (ms <= 0) {
            throw new ConfigError("[storage] " + key + " must be more than 0, got " + value);
        }
        return (long) ms;
    }

    /** Settings one by one; defaults are RocketMQ's, as in the Python client. */
    public static final class Builder {
        private String lakehouse = "lakehouse";
        private final Map<String, String> storage = new LinkedHashMap<>();
        private int transactionTimeoutMs = 6000;
        private int transactionCheckIntervalMs = 60000;
        private int commitIntervalMs = 10;
        private int producerHeartbeatMs = 2000;
        private Map<String, List<String>> topicGrants;

        public Builder lakehouse(String lakehouse) {
            this.lakehouse = lakehouse;
            return this;
        }

        public Builder storage(String key, String value) {
            this.storage.put(key, value);
            return this;
        }

        public Builder transactionTimeoutMs(int ms) {
            this.transactionTimeoutMs = ms;
            return this;
        }

        public Builder transactionCheckIntervalMs(int ms) {
            this.transactionCheckIntervalMs = ms;
            return this;
        }

        public Builder commitIntervalMs(int ms) {
            this.commitIntervalMs = ms;
            return this;
        }

        public Builder producerHeartbeatMs(int ms) {
            this.producerHeartbeatMs = ms;
            return this;
        }

        public Builder topicGrants(Map<String, List<String>> grants) {
            this.topicGrants = grants;
            return this;
        }

        void setInt(String key, int value) {
            switch (key) {
                case "transaction_timeout_ms" -> transactionTimeoutMs = value;
                case "transaction_check_interval_ms" -> transactionCheckIntervalMs = value;
                case "commit_interval_ms" -> commitIntervalMs = value;
                case "producer_heartbeat_ms" -> producerHeartbeatMs = value;
                default -> { } // the checker's: read and checked by it
            }
        }

        public CoordinatorConfig build() {
            return new CoordinatorConfig(this);
        }
    }
}
