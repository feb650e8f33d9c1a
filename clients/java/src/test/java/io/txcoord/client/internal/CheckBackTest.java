package io.txcoord.client.internal;

import io.txcoord.client.CoordinatorConfig;
import io.txcoord.client.LocalTransactionState;
import io.txcoord.client.Message;
import io.txcoord.client.MessageExt;
import io.txcoord.client.TransactionListener;
import io.txcoord.client.TransactionProducer;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The checker's side written by hand: a check_requests table, as the checker appends to it. */
class CheckBackTest {
    static final MessageType CHECKS = MessageTypeParser.parseMessageType("message spark_schema {\n"
            + "optional binary check_id (STRING); optional binary transaction_id (STRING);\n"
            + "optional binary producer_group (STRING); optional int32 check_times; optional int96 requested_at;\n"
            + "optional int64 half_offset; optional binary msg_id (STRING); optional binary topic (STRING);\n"
            + "optional binary keys (STRING); optional binary tags (STRING);\n"
            + "optional group properties (MAP) { repeated group key_value { required binary key (STRING); optional binary value (STRING); } }\n"
            + "optional binary body; optional int96 born_timestamp; optional int64 batch_id;\n"
            + "optional binary producer_instance (STRING); }");

    record Check(String checkId, String transactionId, String instance, Instant requestedAt) {
    }

    @TempDir
    Path lakehouse;

    /** Spark's default timestamp: INT96, nanoseconds of the day then the Julian day, little-endian. */
    static org.apache.parquet.io.api.Binary int96(Instant t) {
        long day = Math.floorDiv(t.getEpochSecond(), 86_400L);
        long nanos = (t.getEpochSecond() - day * 86_400L) * 1_000_000_000L + t.getNano();
        var buffer = java.nio.ByteBuffer.allocate(12).order(java.nio.ByteOrder.LITTLE_ENDIAN);
        buffer.putLong(nanos).putInt((int) (day + 2_440_588L));
        return org.apache.parquet.io.api.Binary.fromConstantByteArray(buffer.array());
    }

    static void fill(Check c, Group g) {
        g.add("check_id", c.checkId());
        g.add("transaction_id", c.transactionId());
        g.add("producer_group", "order_group");
        g.add("check_times", 1);
        g.add("requested_at", int96(c.requestedAt()));
        g.add("half_offset", 7L);
        g.add("msg_id", "m-" + c.transactionId());
        g.add("topic", "ORDER_TOPIC");
        g.add("keys", "order-1");
        g.addGroup("properties").addGroup("key_value").append("key", "a").append("value", "b");
        g.add("body", org.apache.parquet.io.api.Binary.fromString("{\"order\":1}"));
        g.add("born_timestamp", int96(c.requestedAt()));
        g.add("batch_id", 3L);
        if (c.instance() != null) {
            g.add("producer_instance", c.instance());
        }
    }

    static void request(LocalStore store, Check... checks) throws Exception {
        DeltaLog table = new DeltaLog(store, "groups/order_group/check_requests");
        table.createIfMissing("{\"type\":\"struct\",\"fields\":[]}", Map.of("delta.enableChangeDataFeed", "true"));
        table.load();
        table.append(Parquet.write(CHECKS, List.of(checks), CheckBackTest::fill), checks.length);
    }

    /** A listener whose local transactions commit and whose checks {@code check} answers. */
    static TransactionListener checking(java.util.function.Function<MessageExt, LocalTransactionState> check) {
        return new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                return check.apply(msg);
            }
        };
    }

    @Test
    void answersTheChecksAddressedToItOnceEach() throws Exception {
        LocalStore store = new LocalStore(lakehouse.toString());
        Instant now = Instant.now();
        Map<String, MessageExt> asked = new ConcurrentHashMap<>();
        TransactionListener listener = checking(msg -> {
            asked.put(msg.getCheckId(), msg);
            return msg.getTransactionId().equals("t1") ? LocalTransactionState.ROLLBACK_MESSAGE : null;
        });
        // Before start: one request of the last check interval (answered), one older (superseded: not answered).
        request(store, new Check("t1-1", "t1", null, now.minusSeconds(5)), new Check("t0-1", "t0", null, now.minusSeconds(600)));
        CoordinatorConfig config = CoordinatorConfig.builder().lakehouse(lakehouse.toString()).build();
        try (TransactionProducer producer = new TransactionProducer("order_group", listener, config).start()) {
            waitFor(() -> asked.containsKey("t1-1"));
            // While it runs: one for it, one for another instance, and t1-1 again (already answered).
            request(store, new Check("t2-1", "t2", producer.getInstanceId(), Instant.now()),
                    new Check("t3-1", "t3", "someone-else", Instant.now()), new Check("t1-1", "t1", null, now));
            waitFor(() -> asked.containsKey("t2-1"));
            Thread.sleep(500);
        }
        assertEquals(List.of("t1-1", "t2-1"), asked.keySet().stream().sorted().toList());
        MessageExt msg = asked.get("t1-1");
        assertEquals("ORDER_TOPIC", msg.getTopic());
        assertEquals("{\"order\":1}", new String(msg.getBody(), StandardCharsets.UTF_8));
        assertEquals("m-t1", msg.getMsgId());
        assertEquals("order-1", msg.getKeys());
        assertEquals(Map.of("a", "b"), msg.getProperties());
        assertEquals(1, msg.getCheckTimes());
        assertEquals(7, msg.getQueueOffset());
        assertEquals(now.minusSeconds(5), msg.getBornTimestamp());

        List<String> answers = new ArrayList<>();
        for (Path commit : Files.list(lakehouse.resolve("groups/order_group/commit_log/_delta_log")).sorted().toList()) {
            for (String line : Files.readAllLines(commit)) {
                var action = DeltaLog.JSON.readTree(line);
                if (action.has("add")) {
                    for (Map<String, Object> row : Parquet.read(Files.readAllBytes(
                            lakehouse.resolve("groups/order_group/commit_log/" + action.get("add").get("path").asText())))) {
                        answers.add(row.get("transaction_id") + " " + row.get("state") + " " + row.get("check_id"));
                    }
                }
            }
        }
        assertEquals(List.of("t1 ROLLBACK_MESSAGE t1-1", "t2 UNKNOW t2-1"), answers.stream().sorted().toList());
    }

    @Test
    void checksRunOnTheExecutorSetAsRocketMQsSetExecutorServiceAndShutdownStopsIt() throws Exception {
        LocalStore store = new LocalStore(lakehouse.toString());
        java.util.concurrent.CompletableFuture<String> checkedOn = new java.util.concurrent.CompletableFuture<>();
        TransactionListener listener = checking(msg -> {
            checkedOn.complete(Thread.currentThread().getName());
            return LocalTransactionState.COMMIT_MESSAGE;
        });
        java.util.concurrent.ExecutorService executor = java.util.concurrent.Executors.newFixedThreadPool(2,
                r -> new Thread(r, "service-checks"));
        request(store, new Check("t1-1", "t1", null, Instant.now()));
        CoordinatorConfig config = CoordinatorConfig.builder().lakehouse(lakehouse.toString()).build();
        TransactionProducer producer = new TransactionProducer("order_group", listener, config);
        producer.setExecutorService(executor);
        assertEquals(executor, producer.getExecutorService());
        try (producer) {
            producer.start();
            assertEquals("service-checks", checkedOn.get(30, java.util.concurrent.TimeUnit.SECONDS));
            org.junit.jupiter.api.Assertions.assertThrows(io.txcoord.client.ProducerStateError.class,
                    () -> producer.setExecutorService(executor));
        }
        assertTrue(executor.isShutdown(), "shutdown() shuts the executor down, as RocketMQ's producer does");
    }

    static void waitFor(java.util.function.BooleanSupplier condition) throws InterruptedException {
        long deadline = System.currentTimeMillis() + 10_000;
        while (!condition.getAsBoolean()) {
            assertTrue(System.currentTimeMillis() < deadline, "timed out");
            Thread.sleep(20);
        }
    }
}
