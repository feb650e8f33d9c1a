package io.txcoord.client.internal;

import io.txcoord.client.UnsupportedTableError;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class DeltaLogTest {
    @TempDir
    Path root;

    private static byte[] file(String transactionId) throws Exception {
        return Records.toParquet(List.of(Records.end("g", transactionId, "COMMIT_MESSAGE", null)));
    }

    @Test
    void createsVersionZeroAsTheProtocolSays() throws Exception {
        LocalStore store = new LocalStore(root.toString());
        DeltaLog log = new DeltaLog(store, "groups/g/commit_log");
        log.createIfMissing(Records.SCHEMA_STRING, Records.CONFIGURATION);
        log.createIfMissing(Records.SCHEMA_STRING, Records.CONFIGURATION); // exists: nothing to do
        List<String> lines = Files.readAllLines(root.resolve("groups/g/commit_log/_delta_log/00000000000000000000.json"));
        assertEquals(3, lines.size());
        var json = DeltaLog.JSON;
        assertTrue(json.readTree(lines.get(0)).has("commitInfo"));
        assertEquals("{\"minReaderVersion\":1,\"minWriterVersion\":4}", json.readTree(lines.get(1)).get("protocol").toString());
        var meta = json.readTree(lines.get(2)).get("metaData");
        assertEquals("parquet", meta.get("format").get("provider").asText());
        assertEquals(Records.SCHEMA_STRING, meta.get("schemaString").asText());
        assertEquals("true", meta.get("configuration").get("delta.enableChangeDataFeed").asText());
        assertEquals("interval 2 minutes", meta.get("configuration").get("delta.deletedFileRetentionDuration").asText());
        assertEquals(0, meta.get("partitionColumns").size());
        log.load();
        assertEquals(0, log.version());
        assertEquals(1, log.append(file("t1"), 1));
        var info = json.readTree(Files.readAllLines(
                root.resolve("groups/g/commit_log/_delta_log/00000000000000000001.json")).get(0)).get("commitInfo");
        assertEquals(1, info.get("txcoordProtocol").asInt()); // docs/protocol.md#versioning
        assertTrue(info.get("txcoordProtocol").isInt());
    }

    @Test
    void writersRacingForVersionsEachGetTheirOwn() throws Exception {
        LocalStore store = new LocalStore(root.toString());
        new DeltaLog(store, "t").createIfMissing(Records.SCHEMA_STRING, Records.CONFIGURATION);
        int writers = 4;
        int each = 25;
        ExecutorService pool = Executors.newFixedThreadPool(writers);
        List<Future<List<Long>>> results = new ArrayList<>();
        for (int w = 0; w < writers; w++) {
            int writer = w;
            results.add(pool.submit(() -> {
                DeltaLog log = new DeltaLog(store, "t"); // one per writer, as separate processes have
                List<Long> versions = new ArrayList<>();
                for (int i = 0; i < each; i++) {
                    versions.add(log.append(file("w" + writer + "x" + i), 1));
                }
                return versions;
            }));
        }
        List<Long> all = new ArrayList<>();
        for (Future<List<Long>> f : results) {
            all.addAll(f.get());
        }
        pool.shutdown();
        Collections.sort(all);
        List<Long> expected = new ArrayList<>();
        for (long v = 1; v <= writers * each; v++) {
            expected.add(v);
        }
        assertEquals(expected, all);
    }

    @Test
    void aCreateRefusedAsTakenThatWasNotMadeLeavesNoGap() throws Exception {
        LocalStore local = new LocalStore(root.toString());
        new DeltaLog(local, "t").createIfMissing(Records.SCHEMA_STRING, Records.CONFIGURATION);
        java.util.concurrent.atomic.AtomicBoolean refused = new java.util.concurrent.atomic.AtomicBoolean();
        ObjectStore store = (ObjectStore) java.lang.reflect.Proxy.newProxyInstance(getClass().getClassLoader(),
                new Class<?>[]{ObjectStore.class}, (proxy, method, args) -> {
                    // As S3's 409 for a competing conditional write: "taken", though nothing was written.
                    if (method.getName().equals("create") && ((String) args[0]).endsWith("00000000000000000001.json")
                            && refused.compareAndSet(false, true)) {
                        return false;
                    }
                    return method.invoke(local, args);
                });
        DeltaLog log = new DeltaLog(store, "t");
        assertEquals(1, log.append(file("a"), 1));
        assertTrue(refused.get());
        assertEquals(2, log.append(file("b"), 1));
    }

    @Test
    void neverCreatesAVersionBelowTheLastCheckpoint() throws Exception {
        LocalStore store = new LocalStore(root.toString());
        DeltaLog log = new DeltaLog(store, "t");
        log.createIfMissing(Records.SCHEMA_STRING, Records.CONFIGURATION);
        assertEquals(1, log.append(file("a"), 1));
        // Another writer went on to version 9, checkpointed it, and log cleanup removed versions 1 to 8.
        Files.writeString(root.resolve("t/_delta_log/_last_checkpoint"), "{\"version\":9,\"size\":3}");
        Files.delete(root.resolve("t/_delta_log/00000000000000000001.json"));
        assertEquals(10, log.append(file("b"), 1));
    }

    @Test
    void readsTheProtocolFromACheckpointOnceLogCleanupRemovedTheCommits() throws Exception {
        // A commit log of versions 0 to 3 that delta-rs checkpointed at 3, with commits 0 to 3 deleted since.
        Path log = root.resolve("t/_delta_log");
        Files.createDirectories(log);
        for (String name : List.of("00000000000000000003.checkpoint.parquet", "_last_checkpoint")) {
            try (var in = getClass().getResourceAsStream("/checkpointed-log/_delta_log/" + name)) {
                Files.copy(in, log.resolve(name));
            }
        }
        DeltaLog table = new DeltaLog(new LocalStore(root.toString()), "t");
        table.load();
        assertEquals(3, table.version());
        assertEquals(4, table.append(file("after"), 1));
    }

    @Test
    void refusesATableABlindAppendDoesNotHonour() throws Exception {
        Path log = root.resolve("t/_delta_log");
        Files.createDirectories(log);
        Files.writeString(log.resolve("00000000000000000000.json"), String.join("\n",
                "{\"commitInfo\":{}}",
                "{\"protocol\":{\"minReaderVersion\":3,\"minWriterVersion\":7,\"readerFeatures\":[\"deletionVectors\"],"
                        + "\"writerFeatures\":[\"deletionVectors\",\"appendOnly\"]}}",
                "{\"metaData\":{\"id\":\"x\",\"format\":{\"provider\":\"parquet\"},\"schemaString\":\"{}\","
                        + "\"partitionColumns\":[],\"configuration\":{}}}", ""));
        DeltaLog table = new DeltaLog(new LocalStore(root.toString()), "t");
        assertThrows(UnsupportedTableError.class, table::load);
        Files.writeString(log.resolve("00000000000000000000.json"), String.join("\n",
                "{\"protocol\":{\"minReaderVersion\":1,\"minWriterVersion\":4}}",
                "{\"metaData\":{\"id\":\"x\",\"format\":{\"provider\":\"parquet\"},\"schemaString\":\"{}\","
                        + "\"partitionColumns\":[],\"configuration\":{\"delta.constraints.positive\":\"a > 0\"}}}", ""));
        assertThrows(UnsupportedTableError.class, table::load);
    }

    @Test
    void parquetRoundTripKeepsEveryColumn() throws Exception {
        Instant born = Instant.parse("2026-11-28T19:55:57.396066Z");
        Records.Record half = Records.half("g", "t1", "m1", 0, 2, "T", "k", "tag", Map.of("a", "b"),
                "body".getBytes(StandardCharsets.UTF_8), born);
        Records.Record end = Records.end("g", "t1", "UNKNOW", "t1-1");
        List<Map<String, Object>> rows = Parquet.read(Records.toParquet(List.of(half, end)));
        assertEquals(2, rows.size());
        Map<String, Object> h = rows.get(0);
        assertEquals(List.of("record_id", "kind", "transaction_id", "producer_group", "msg_id", "message_index",
                "message_count", "topic", "keys", "tags", "properties", "body", "born_timestamp", "state", "check_id"),
                new ArrayList<>(h.keySet()));
        assertEquals("HALF", h.get("kind"));
        assertEquals(2, h.get("message_count"));
        assertEquals(Map.of("a", "b"), h.get("properties"));
        assertEquals("body", new String((byte[]) h.get("body"), StandardCharsets.UTF_8));
        assertEquals(born, h.get("born_timestamp"));
        Map<String, Object> e = rows.get(1);
        assertEquals("t1-1", e.get("check_id"));
        assertEquals(null, e.get("properties"));
        assertEquals(null, e.get("body"));
    }
}
