package io.txcoord.client;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class CoordinatorConfigTest {
    @TempDir
    Path dir;

    private Path toml(String text) throws Exception {
        Path file = dir.resolve("coordinator.toml");
        Files.writeString(file, text);
        return file;
    }

    @Test
    void readsThePythonProducersToml() throws Exception {
        Path file = toml("""
                lakehouse = "s3://bucket/lh"
                transaction_timeout_ms = 1500
                producer_heartbeat_ms = 500
                trigger_interval_ms = 100
                consumer_retry_delays_ms = [1000, 2000]
                [storage]
                aws_endpoint = "http://127.0.0.1:9000"
                aws_allow_http = true
                max_retries = 3
                retry_timeout = "2m"
                timeout = "1500ms"
                [topic_grants]
                order_group = ["ORDER_TOPIC", "AUDIT_*"]
                """);
        CoordinatorConfig config = CoordinatorConfig.load(file, Map.of());
        assertEquals("s3://bucket/lh", config.getLakehouse());
        assertTrue(config.isObjectStore());
        assertEquals(1500, config.getTransactionTimeoutMs());
        assertEquals(500, config.getProducerHeartbeatMs());
        assertEquals(10, config.getCommitIntervalMs());
        assertEquals("true", config.getStorage().get("aws_allow_http"));
        assertEquals(3, config.maxRetries());
        assertEquals(120_000, config.retryTimeoutMs());
        assertEquals(1500, config.requestTimeoutMs());
        assertEquals(List.of("ORDER_TOPIC", "AUDIT_*"), config.getTopicGrants().get("order_group"));
    }

    @Test
    void theEnvironmentOverridesTheFile() throws Exception {
        Path file = toml("lakehouse = \"/data/lh\"\ncommit_interval_ms = 20\n");
        CoordinatorConfig config = CoordinatorConfig.load(file, Map.of("TXCOORD_LAKEHOUSE", "/other",
                "TXCOORD_COMMIT_INTERVAL_MS", "5"));
        assertEquals("/other", config.getLakehouse());
        assertEquals(5, config.getCommitIntervalMs());
        assertFalse(config.isObjectStore());
        assertNull(config.getTopicGrants());
    }

    @Test
    void refusesUnknownKeysBadValuesAndMissingFiles() throws Exception {
        assertThrows(ConfigError.class, () -> CoordinatorConfig.load(toml("lakehous = \"x\"\n"), Map.of()));
        assertThrows(ConfigError.class, () -> CoordinatorConfig.load(toml("commit_interval_ms = \"ten\"\n"), Map.of()));
        assertThrows(ConfigError.class, () -> CoordinatorConfig.load(toml("commit_interval_ms = 0\n"), Map.of()));
        assertThrows(ConfigError.class, () -> CoordinatorConfig.load(toml("lakehouse = \"gs://b/lh\"\n"), Map.of()));
        assertThrows(ConfigError.class, () -> CoordinatorConfig.load(toml("lakehouse = [\n"), Map.of()));
        assertThrows(ConfigError.class, () -> CoordinatorConfig.load(dir.resolve("missing.toml"), Map.of()));
        assertThrows(ConfigError.class, () -> CoordinatorConfig.load(toml("[storage]\nretry_timeout = \"soon\"\n"), Map.of()));
        assertThrows(ConfigError.class, () -> CoordinatorConfig.load(toml("[storage]\ntimeout = \"0s\"\n"), Map.of()));
    }

    @Test
    void readsTheRepositorysOwnToml() {
        Path repoToml = Path.of("../../conf/coordinator.toml");
        if (Files.exists(repoToml)) {
            assertEquals("lakehouse", CoordinatorConfig.load(repoToml, Map.of()).getLakehouse());
        }
    }
}
