package io.txcoord.client;

import io.txcoord.client.internal.LocalStore;
import io.txcoord.client.internal.Parquet;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class ProducerTest {
    @TempDir
    Path lakehouse;
    CoordinatorConfig config;
    final List<TransactionProducer> producers = new ArrayList<>();

    static final class Listener implements TransactionListener {
        volatile LocalTransactionState local = LocalTransactionState.COMMIT_MESSAGE;
        final List<Object> executed = new ArrayList<>();

        @Override
        public synchronized LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            executed.add(arg);
            return local;
        }

        @Override
        public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            return LocalTransactionState.ROLLBACK_MESSAGE;
        }
    }

    @BeforeEach
    void setUp() {
        config = CoordinatorConfig.builder().lakehouse(lakehouse.toString()).producerHeartbeatMs(200).build();
    }

    @AfterEach
    void tearDown() {
        producers.forEach(TransactionProducer::shutdown);
    }

    TransactionProducer started(TransactionListener listener) {
        TransactionProducer producer = new TransactionProducer("order_group", listener, config);
        producers.add(producer);
        return producer.start();
    }

    /** Every record of a commit log, read from its commits' data files, with the version each came in. */
    static List<Map<String, Object>> records(Path log) throws Exception {
        List<Map<String, Object>> rows = new ArrayList<>();
        try (Stream<Path> commits = Files.list(log.resolve("_delta_log"))) {
            for (Path commit : commits.filter(p -> p.getFileName().toString().matches("[0-9]{20}\\.json")).sorted().toList()) {
                long version = Long.parseLong(commit.getFileName().toString().substring(0, 20));
                for (String line : Files.readAllLines(commit)) {
                    var action = new com.fasterxml.jackson.databind.ObjectMapper().readTree(line);
                    if (action.has("add")) {
                        for (Map<String, Object> row : Parquet.read(Files.readAllBytes(log.resolve(action.get("add").get("path").asText())))) {
                            row.put("_version", version);
                            rows.add(row);
                        }
                    }
                }
            }
        }
        return rows;
    }

    @Test
    void aSendStoresItsHalfThenItsEndInALaterCommit() throws Exception {
        Listener listener = new Listener();
        TransactionProducer producer = started(listener);
        Message msg = new Message("ORDER_TOPIC", "created", "order-42", "{\"order\":42}".getBytes(StandardCharsets.UTF_8));
        msg.putUserProperty(Message.CHECK_IMMUNITY_TIME_IN_SECONDS, "10");
        msg.putUserProperty("DELAY", "3");
        TransactionSendResult result = producer.sendMessageInTransaction(msg, "arg");
        assertEquals(SendStatus.SEND_OK, result.getSendStatus());
        assertEquals(LocalTransactionState.COMMIT_MESSAGE, result.getLocalTransactionState());
        assertTrue(result.getTransactionId().matches("[0-9a-f]{32}"));
        assertEquals(result.getTransactionId(), msg.getTransactionId());
        assertEquals(List.of("arg"), listener.executed);
        producer.shutdown();

        List<Map<String, Object>> rows = records(lakehouse.resolve("groups/order_group/commit_log"));
        assertEquals(2, rows.size());
        Map<String, Object> half = rows.stream().filter(r -> "HALF".equals(r.get("kind"))).findFirst().orElseThrow();
        Map<String, Object> end = rows.stream().filter(r -> "END".equals(r.get("kind"))).findFirst().orElseThrow();
        assertEquals(result.getTransactionId(), half.get("transaction_id"));
        assertEquals("order_group", half.get("producer_group"));
        assertEquals(result.getMsgId(), half.get("msg_id"));
        assertEquals(0, half.get("message_index"));
        assertEquals(1, half.get("message_count"));
        assertEquals("order-42", half.get("keys"));
        assertEquals("created", half.get("tags"));
        assertEquals(Map.of(Message.CHECK_IMMUNITY_TIME_IN_SECONDS, "10"), half.get("properties")); // DELAY removed
        assertEquals("{\"order\":42}", new String((byte[]) half.get("body"), StandardCharsets.UTF_8));
        assertNull(half.get("state"));
        assertEquals("COMMIT_MESSAGE", end.get("state"));
        assertNull(end.get("check_id"));
        assertNull(end.get("msg_id"));
        assertTrue((Long) end.get("_version") > (Long) half.get("_version"));
    }

    @Test
    void concurrentSendsShareCommits() throws Exception {
        TransactionProducer producer = started(new Listener());
        int threads = 16;
        int each = 20;
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        List<Future<String>> sent = new ArrayList<>();
        for (int i = 0; i < threads * each; i++) {
            int n = i;
            sent.add(pool.submit(() -> producer.sendMessageInTransaction(
                    new Message("T", ("m" + n).getBytes(StandardCharsets.UTF_8)), n).getTransactionId()));
        }
        Set<String> ids = new HashSet<>();
        for (Future<String> f : sent) {
            ids.add(f.get());
        }
        pool.shutdown();
        producer.shutdown();
        assertEquals(threads * each, ids.size());
        List<Map<String, Object>> rows = records(lakehouse.resolve("groups/order_group/commit_log"));
        Map<String, Integer> kinds = new HashMap<>();
        Set<Long> versions = new HashSet<>();
        for (Map<String, Object> row : rows) {
            kinds.merge(row.get("transaction_id") + "/" + row.get("kind"), 1, Integer::sum);
            versions.add((Long) row.get("_version"));
        }
        assertEquals(2 * threads * each, kinds.size());
        assertTrue(kinds.values().stream().allMatch(n -> n == 1));
        // Group commit: far fewer commits than records (each send makes two records).
        assertTrue(versions.size() < threads * each, "commits: " + versions.size());
    }

    @Test
    void severalMessagesInOneTransactionShareOneCommit() throws Exception {
        TransactionProducer producer = started(new Listener());
        List<Message> msgs = List.of(new Message("A", new byte[]{1}), new Message("B", new byte[]{2}), new Message("A", new byte[]{3}));
        TransactionSendResult result = producer.sendMessagesInTransaction(msgs, null);
        assertEquals(3, result.getMsgIds().size());
        producer.shutdown();
        List<Map<String, Object>> halves = records(lakehouse.resolve("groups/order_group/commit_log")).stream()
                .filter(r -> "HALF".equals(r.get("kind"))).toList();
        assertEquals(3, halves.size());
        assertEquals(1, halves.stream().map(r -> r.get("_version")).distinct().count());
        assertEquals(Set.of(0, 1, 2), new HashSet<>(halves.stream().map(r -> r.get("message_index")).toList()));
        assertTrue(halves.stream().allMatch(r -> Integer.valueOf(3).equals(r.get("message_count"))));
    }

    @Test
    void invalidMessagesAreRefusedBeforeAnythingIsWritten() {
        Listener listener = new Listener();
        TransactionProducer producer = started(listener);
        List<Message> bad = new ArrayList<>(List.of(
                new Message("bad topic", new byte[]{1}), new Message("a/../b", new byte[]{1}),
                new Message("%41", new byte[]{1}), new Message("x".repeat(128), new byte[]{1}),
                new Message("", new byte[]{1}), new Message("T", new byte[0]), new Message("T", null),
                new Message("T", new byte[4 * 1024 * 1024 + 1])));
        Message immunity = new Message("T", new byte[]{1});
        immunity.putUserProperty(Message.CHECK_IMMUNITY_TIME_IN_SECONDS, "0");
        bad.add(immunity);
        for (Message msg : bad) {
            MessageValidationError e = assertThrows(MessageValidationError.class,
                    () -> producer.sendMessageInTransaction(msg, null), msg.toString());
            assertFalse(e.retriable());
            assertFalse(e.outcomeUnknown());
        }
        Message twice = new Message("T", new byte[]{1});
        assertThrows(MessageValidationError.class, () -> producer.sendMessagesInTransaction(List.of(twice, twice), null));
        assertThrows(MessageValidationError.class, () -> producer.sendMessagesInTransaction(List.of(), null));
        assertTrue(listener.executed.isEmpty());
        assertEquals(SendStatus.SEND_OK, producer.sendMessageInTransaction(new Message("T", new byte[4 * 1024 * 1024]), null)
                .getSendStatus()); // the largest body allowed
    }

    @Test
    void ungrantedTopicsAreRefused() {
        config = config.toBuilder().topicGrants(Map.of("order_group", List.of("ORDER_*"))).build();
        TransactionProducer producer = started(new Listener());
        producer.sendMessageInTransaction(new Message("ORDER_EU", new byte[]{1}), null);
        assertThrows(MessageValidationError.class, () -> producer.sendMessageInTransaction(new Message("PAYMENTS", new byte[]{1}), null));
    }

    @Test
    void aProducerIsUsedOnlyBetweenStartAndShutdown() {
        TransactionProducer producer = new TransactionProducer("order_group", new Listener(), config);
        assertThrows(ProducerStateError.class, () -> producer.sendMessageInTransaction(new Message("T", new byte[]{1}), null));
        producer.start();
        producer.start(); // idempotent
        producer.shutdown();
        producer.shutdown();
        assertThrows(ProducerStateError.class, () -> producer.sendMessageInTransaction(new Message("T", new byte[]{1}), null));
        assertThrows(ProducerStateError.class, producer::start);
        assertThrows(MessageValidationError.class, () -> new TransactionProducer("bad group", new Listener(), config));
    }

    @Test
    void instancesClaimLogsOfTheirOwnAndWithdrawAtShutdown() throws Exception {
        TransactionProducer first = started(new Listener());
        TransactionProducer second = started(new Listener());
        assertEquals(0, first.getCommitLogNumber());
        assertEquals(1, second.getCommitLogNumber());
        Path producers = lakehouse.resolve("groups/order_group/_producers");
        var record = new com.fasterxml.jackson.databind.ObjectMapper().readTree(
                producers.resolve(first.getInstanceId() + ".json").toFile());
        assertEquals("order_group", record.get("group").asText());
        assertEquals(first.getInstanceId(), record.get("instance_id").asText());
        assertEquals(ProcessHandle.current().pid(), record.get("pid").asLong());
        assertEquals(0.2, record.get("heartbeat_s").asDouble());
        assertTrue(Files.exists(lakehouse.resolve("groups/order_group/commit_log.1/_delta_log/00000000000000000000.json")));
        second.shutdown();
        assertFalse(Files.exists(producers.resolve(second.getInstanceId() + ".json")));
        assertFalse(Files.exists(producers.resolve("commit_log.1.claim")));
        // A third instance takes the freed log; the first's is still held.
        TransactionProducer third = started(new Listener());
        assertEquals(1, third.getCommitLogNumber());
    }

    @Test
    void aStartThatFailsLeavesNoRecordAndNoClaim() throws Exception {
        Path log = lakehouse.resolve("groups/order_group/commit_log/_delta_log");
        Files.createDirectories(log);
        Files.writeString(log.resolve("00000000000000000000.json"),
                "{\"protocol\":{\"minReaderVersion\":3,\"minWriterVersion\":7,\"writerFeatures\":[\"deletionVectors\"]}}\n");
        TransactionProducer producer = new TransactionProducer("order_group", new Listener(), config);
        assertThrows(UnsupportedTableError.class, producer::start);
        try (Stream<Path> left = Files.list(lakehouse.resolve("groups/order_group/_producers"))) {
            assertEquals(List.of(), left.map(p -> p.getFileName().toString()).filter(n -> !n.startsWith(".")).toList());
        }
    }

    @Test
    void theHeartbeatRenewsTheInstanceRecord() throws Exception {
        TransactionProducer producer = started(new Listener());
        Path record = lakehouse.resolve("groups/order_group/_producers/" + producer.getInstanceId() + ".json");
        var json = new com.fasterxml.jackson.databind.ObjectMapper();
        double first = json.readTree(record.toFile()).get("last_seen").asDouble();
        long deadline = System.currentTimeMillis() + 5000;
        while (json.readTree(Files.readAllBytes(record)).get("last_seen").asDouble() <= first) {
            assertTrue(System.currentTimeMillis() < deadline, "the record was not renewed");
            Thread.sleep(50);
        }
    }

    @Test
    void aStorageThatRefusesIsHalfNotStoredNotRetriable() throws Exception {
        TransactionProducer producer = started(new Listener());
        Path log = lakehouse.resolve("groups/order_group/commit_log");
        log.toFile().setWritable(false);
        try {
            if (Files.isWritable(log)) {
                return; // root ignores permissions: nothing to see
            }
            HalfNotStoredError e = assertThrows(HalfNotStoredError.class,
                    () -> producer.sendMessageInTransaction(new Message("T", new byte[]{1}), null));
            assertFalse(e.retriable());
            assertFalse(e.outcomeUnknown());
        } finally {
            log.toFile().setWritable(true);
        }
    }

    @Test
    void localStoreCreatesOnlyIfAbsent() throws Exception {
        LocalStore store = new LocalStore(lakehouse.toString());
        int writers = 8;
        ExecutorService pool = Executors.newFixedThreadPool(writers);
        List<Future<Boolean>> created = new ArrayList<>();
        for (int i = 0; i < writers; i++) {
            byte[] content = ("writer " + i).getBytes(StandardCharsets.UTF_8);
            created.add(pool.submit(() -> store.create("t/_delta_log/00000000000000000001.json", content)));
        }
        int won = 0;
        for (Future<Boolean> f : created) {
            won += f.get() ? 1 : 0;
        }
        pool.shutdown();
        assertEquals(1, won);
        var read = store.read("t/_delta_log/00000000000000000001.json");
        assertTrue(new String(read.data(), StandardCharsets.UTF_8).startsWith("writer "));
        assertFalse(store.replace("t/_delta_log/00000000000000000001.json", new byte[]{1}, "stale"));
        assertTrue(store.replace("t/_delta_log/00000000000000000001.json", new byte[]{1}, read.etag()));
        try (Stream<Path> left = Files.list(lakehouse.resolve("t/_delta_log"))) {
            assertEquals(List.of("00000000000000000001.json"), left.map(p -> p.getFileName().toString())
                    .filter(n -> !n.endsWith(".lock")).toList());
        }
    }
}
