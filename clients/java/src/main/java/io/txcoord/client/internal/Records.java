package io.txcoord.client.internal;

import org.apache.parquet.example.data.Group;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;

import java.io.IOException;
import java.security.SecureRandom;
import java.time.Instant;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

/** The commit log's records (docs/protocol.md#the-commit-log): their schema, ids and Parquet form. */
public final class Records {
    /** The 15 columns, in order, as Parquet holds them (the Python client's pyarrow writes the same). */
    public static final MessageType SCHEMA = MessageTypeParser.parseMessageType("message spark_schema {\n"
            + "  optional binary record_id (STRING);\n"
            + "  optional binary kind (STRING);\n"
            + "  optional binary transaction_id (STRING);\n"
            + "  optional binary producer_group (STRING);\n"
            + "  optional binary msg_id (STRING);\n"
            + "  optional int32 message_index;\n"
            + "  optional int32 message_count;\n"
            + "  optional binary topic (STRING);\n"
            + "  optional binary keys (STRING);\n"
            + "  optional binary tags (STRING);\n"
            + "  optional group properties (MAP) {\n"
            + "    repeated group key_value {\n"
            + "      required binary key (STRING);\n"
            + "      optional binary value (STRING);\n"
            + "    }\n"
            + "  }\n"
            + "  optional binary body;\n"
            + "  optional int64 born_timestamp (TIMESTAMP(MICROS,true));\n"
            + "  optional binary state (STRING);\n"
            + "  optional binary check_id (STRING);\n"
            + "}");

    /** The commit log's Delta schema (metaData.schemaString). */
    public static final String SCHEMA_STRING;

    static {
        StringBuilder s = new StringBuilder("{\"type\":\"struct\",\"fields\":[");
        String[][] columns = {{"record_id", "\"string\""}, {"kind", "\"string\""}, {"transaction_id", "\"string\""},
                {"producer_group", "\"string\""}, {"msg_id", "\"string\""}, {"message_index", "\"integer\""},
                {"message_count", "\"integer\""}, {"topic", "\"string\""}, {"keys", "\"string\""},
                {"tags", "\"string\""},
                {"properties", "{\"type\":\"map\",\"keyType\":\"string\",\"valueType\":\"string\",\"valueContainsNull\":true}"},
                {"body", "\"binary\""}, {"born_timestamp", "\"timestamp\""}, {"state", "\"string\""},
                {"check_id", "\"string\""}};
        for (int i = 0; i < columns.length; i++) {
            s.append(i == 0 ? "" : ",").append("{\"name\":\"").append(columns[i][0]).append("\",\"type\":")
                    .append(columns[i][1]).append(",\"nullable\":true,\"metadata\":{}}");
        }
        SCHEMA_STRING = s.append("]}").toString();
    }

    /** The commit log's table properties, set when it is created. */
    public static final Map<String, String> CONFIGURATION = Map.of(
            "delta.enableChangeDataFeed", "true",
            "delta.appendOnly", "true",
            "delta.checkpointInterval", "1000",
            "delta.deletedFileRetentionDuration", "interval 2 minutes",
            "delta.enableExpiredLogCleanup", "false");

    private static final SecureRandom RANDOM = new SecureRandom();

    private Records() {
    }

    /** One commit-log record: a HALF (one message of a transaction) or an END (an outcome). */
    public record Record(String recordId, String kind, String transactionId, String producerGroup, String msgId,
                         Integer messageIndex, Integer messageCount, String topic, String keys, String tags,
                         Map<String, String> properties, byte[] body, Instant bornTimestamp, String state,
                         String checkId) {
        public long bodySize() {
            return body == null ? 0 : body.length;
        }
    }

    public static Record half(String group, String transactionId, String msgId, int index, int count, String topic,
                              String keys, String tags, Map<String, String> properties, byte[] body, Instant born) {
        return new Record(randomHex(16), "HALF", transactionId, group, msgId, index, count, topic, keys, tags,
                properties, body, born, null, null);
    }

    public static Record end(String group, String transactionId, String state, String checkId) {
        return new Record(randomHex(16), "END", transactionId, group, null, null, null, null, null, null, null, null,
                Instant.now(), state, checkId);
    }

    /** {@code bytes} random bytes as lowercase hex (a record id, a message id: 16 bytes, a UUID's size). */
    public static String randomHex(int bytes) {
        byte[] b = new byte[bytes];
        RANDOM.nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    /** A new transaction id: 32 hex digits, 12 of milliseconds since the epoch, then 80 random bits. */
    public static String timeOrderedId() {
        return String.format("%012x", System.currentTimeMillis()) + randomHex(10);
    }

    /** The records as one snappy-compressed Parquet data file with the 15 columns. */
    public static byte[] toParquet(List<Record> records) throws IOException {
        return Parquet.write(SCHEMA, records, Records::fill);
    }

    private static void fill(Record r, Group g) {
        text(g, "record_id", r.recordId());
        text(g, "kind", r.kind());
        text(g, "transaction_id", r.transactionId());
        text(g, "producer_group", r.producerGroup());
        text(g, "msg_id", r.msgId());
        if (r.messageIndex() != null) {
            g.add("message_index", r.messageIndex());
        }
        if (r.messageCount() != null) {
            g.add("message_count", r.messageCount());
        }
        text(g, "topic", r.topic());
        text(g, "keys", r.keys());
        text(g, "tags", r.tags());
        if (r.properties() != null) {
            Group map = g.addGroup("properties");
            for (Map.Entry<String, String> e : r.properties().entrySet()) {
                Group kv = map.addGroup("key_value");
                kv.add("key", e.getKey());
                if (e.getValue() != null) {
                    kv.add("value", e.getValue());
                }
            }
        }
        if (r.body() != null) {
            g.add("body", org.apache.parquet.io.api.Binary.fromConstantByteArray(r.body()));
        }
        if (r.bornTimestamp() != null) {
            Instant t = r.bornTimestamp();
            g.add("born_timestamp", t.getEpochSecond() * 1_000_000L + t.getNano() / 1000);
        }
        text(g, "state", r.state());
        text(g, "check_id", r.checkId());
    }

    private static void text(Group g, String column, String value) {
        if (value != null) {
            g.add(column, value);
        }
    }
}
