package io.txcoord.client.internal;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.txcoord.client.CoordinatorException;
import io.txcoord.client.StorageUnavailableError;
import io.txcoord.client.UnsupportedTableError;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadLocalRandom;

/**
 * Appends to one Delta table as docs/protocol.md#making-a-commit says: a data file, then the next version's
 * commit file, created only if absent; a lost race reads the winners' commits and tries the next version. Not
 * thread-safe: one writer thread at a time (the {@link CommitLogWriter}'s).
 */
public final class DeltaLog {
    static final ObjectMapper JSON = new ObjectMapper();
    private static final Logger LOG = LoggerFactory.getLogger(DeltaLog.class);
    /** The writer features a blind append honours (docs/protocol.md, step 1). */
    private static final Set<String> HONOURED_FEATURES = Set.of("appendOnly", "invariants", "checkConstraints",
            "changeDataFeed", "generatedColumns");
    public static final String ENGINE = "txcoord-java/0.1.0";
    /** The client protocol each commit is written under, named in its commitInfo (docs/protocol.md#versioning). */
    public static final int PROTOCOL = 1;
    public static final String PROTOCOL_FIELD = "txcoordProtocol";

    /** Where a commit's read of _last_checkpoint runs beside its data file's write (object storage). */
    private static final ExecutorService BESIDE = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "txcoord-delta-log-read");
        t.setDaemon(true);
        return t;
    });

    private final ObjectStore store;
    private final String key;
    /** The latest version known to exist; -1 before {@link #load()}. */
    private long version = -1;

    public DeltaLog(ObjectStore store, String key) {
        this.store = store;
        this.key = key;
    }

    public String key() {
        return key;
    }

    public long version() {
        return version;
    }

    static String commitName(long version) {
        return String.format("%020d.json", version);
    }

    String commitKey(long version) {
        return key + "/_delta_log/" + commitName(version);
    }

    /** Whether the table exists (its version 0, or a checkpoint once log cleanup removed version 0). */
    public boolean exists() {
        return store.exists(commitKey(0)) || store.exists(key + "/_delta_log/_last_checkpoint");
    }

    /**
     * Creates the table as version 0 if it is missing (docs/protocol.md#creating-a-commit-log); a lost race means
     * another instance made it, which is no error.
     */
    public void createIfMissing(String schemaString, Map<String, String> configuration) {
        if (exists()) {
            return;
        }
        long now = System.currentTimeMillis();
        ObjectNode commitInfo = JSON.createObjectNode();
        ObjectNode info = commitInfo.putObject("commitInfo");
        info.put("timestamp", now);
        info.put("operation", "CREATE TABLE");
        info.putObject("operationParameters").put("mode", "ErrorIfExists");
        info.put("engineInfo", ENGINE);
        info.put("clientVersion", ENGINE);
        ObjectNode protocol = JSON.createObjectNode();
        protocol.putObject("protocol").put("minReaderVersion", 1).put("minWriterVersion", 4);
        ObjectNode metaData = JSON.createObjectNode();
        ObjectNode meta = metaData.putObject("metaData");
        meta.put("id", UUID.randomUUID().toString());
        meta.putNull("name");
        meta.putNull("description");
        ObjectNode format = meta.putObject("format");
        format.put("provider", "parquet");
        format.putObject("options");
        meta.put("schemaString", schemaString);
        meta.putArray("partitionColumns");
        meta.put("createdTime", now);
        ObjectNode conf = meta.putObject("configuration");
        configuration.forEach(conf::put);
        String content = commitInfo + "\n" + protocol + "\n" + metaData + "\n";
        if (!store.create(commitKey(0), content.getBytes(StandardCharsets.UTF_8))) {
            LOG.debug("commit log {} was created by another writer meanwhile", key);
        }
    }

    /** Step 1: the latest version, and a check of the table's protocol and metadata. */
    public void load() {
        long checkpoint = lastCheckpoint();
        long latest = -1;
        for (String name : store.list(key + "/_delta_log")) {
            if (name.matches("[0-9]{20}\\.json")) {
                latest = Math.max(latest, Long.parseLong(name.substring(0, 20)));
            }
        }
        latest = Math.max(latest, checkpoint);
        if (latest < 0) {
            throw new UnsupportedTableError("the commit log " + store.location(key) + " does not exist");
        }
        JsonNode protocol = null;
        JsonNode metaData = null;
        for (long v = checkpoint < 0 ? 0 : checkpoint + 1; v <= latest; v++) {
            JsonNode[] found = actions(v);
            if (found == null) {
                if (v == 0 || v <= checkpoint) {
                    continue;
                }
                throw new StorageUnavailableError("commit " + v + " of " + store.location(key)
                        + " vanished while being read", null);
            }
            protocol = found[0] != null ? found[0] : protocol;
            metaData = found[1] != null ? found[1] : metaData;
        }
        if ((protocol == null || metaData == null) && checkpoint >= 0) {
            JsonNode[] fromCheckpoint = checkpointActions(checkpoint);
            protocol = protocol != null ? protocol : fromCheckpoint[0];
            metaData = metaData != null ? metaData : fromCheckpoint[1];
        }
        refuseUnsupported(protocol, metaData);
        version = latest;
    }

    /** The version {@code _last_checkpoint} names, or -1. */
    private long lastCheckpoint() {
        ObjectStore.Versioned last = store.read(key + "/_delta_log/_last_checkpoint");
        if (last == null) {
            return -1;
        }
        try {
            return JSON.readTree(last.data()).path("version").asLong(-1);
        } catch (IOException e) {
            return -1;
        }
    }

    /** The protocol and metaData actions of commit {@code v} (each null if absent), or null if it does not exist. */
    private JsonNode[] actions(long v) {
        ObjectStore.Versioned commit = store.read(commitKey(v));
        if (commit == null) {
            return null;
        }
        JsonNode[] found = new JsonNode[2];
        for (String line : new String(commit.data(), StandardCharsets.UTF_8).split("\n")) {
            if (line.isBlank()) {
                continue;
            }
            try {
                JsonNode action = JSON.readTree(line);
                if (action.has("protocol")) {
                    found[0] = action.get("protocol");
                }
                if (action.has("metaData")) {
                    found[1] = action.get("metaData");
                }
            } catch (IOException e) {
                throw new UnsupportedTableError("commit " + v + " of " + store.location(key) + " is not Delta JSON: " + e.getMessage());
            }
        }
        return found;
    }

    private JsonNode[] checkpointActions(long v) {
        JsonNode[] found = new JsonNode[2];
        List<String> parts = new ArrayList<>();
        String prefix = String.format("%020d.checkpoint", v);
        for (String name : store.list(key + "/_delta_log")) {
            if (name.startsWith(prefix) && name.endsWith(".parquet")) {
                parts.add(name);
            }
        }
        for (String part : parts) {
            ObjectStore.Versioned file = store.read(key + "/_delta_log/" + part);
            if (file == null) {
                continue;
            }
            try {
                for (Map<String, Object> row : Parquet.read(file.data())) {
                    if (row.get("protocol") != null) {
                        found[0] = JSON.valueToTree(row.get("protocol"));
                    }
                    if (row.get("metaData") != null) {
                        found[1] = JSON.valueToTree(row.get("metaData"));
                    }
                }
            } catch (IOException | RuntimeException e) {
                throw new UnsupportedTableError("checkpoint " + part + " of " + store.location(key) + " cannot be read: " + e);
            }
        }
        return found;
    }

    private void refuseUnsupported(JsonNode protocol, JsonNode metaData) {
        String where = store.location(key);
        if (protocol == null) {
            throw new UnsupportedTableError(where + ": no protocol action found");
        }
        int writer = protocol.path("minWriterVersion").asInt(0);
        if (writer == 7) {
            for (JsonNode feature : protocol.path("writerFeatures")) {
                if (!HONOURED_FEATURES.contains(feature.asText())) {
                    throw new UnsupportedTableError(where + ": writer feature " + feature.asText()
                            + " is not one a blind append honours");
                }
            }
        } else if (writer > 4 || writer < 1) {
            throw new UnsupportedTableError(where + ": minWriterVersion " + writer + " is not one a blind append honours");
        }
        if (metaData != null) {
            metaData.path("configuration").fieldNames().forEachRemaining(name -> {
                if (name.startsWith("delta.constraints.")) {
                    throw new UnsupportedTableError(where + ": has a constraint (" + name + ")");
                }
            });
            String schema = metaData.path("schemaString").asText("");
            if (schema.contains("delta.invariants") || schema.contains("delta.generationExpression")) {
                throw new UnsupportedTableError(where + ": has a column invariant or a generation expression");
            }
        }
    }

    /** A data file written and its commit's bytes built, not yet committed ({@link #prepare}). */
    public static final class Prepared {
        final byte[] content;
        CompletableFuture<Long> checkpointRead;

        Prepared(byte[] content, CompletableFuture<Long> checkpointRead) {
            this.content = content;
            this.checkpointRead = checkpointRead;
        }
    }

    /**
     * Appends {@code dataFile} (Parquet bytes holding {@code numRecords} rows) as the next version: steps 2 to 8.
     * Returns the version made.
     */
    public long append(byte[] dataFile, long numRecords) {
        return commit(prepare(dataFile, numRecords));
    }

    /**
     * Steps 2 and 3: writes the data file and builds the commit's bytes. Thread-safe, and may run while an
     * earlier prepared commit of this log is being made ({@link #commit} takes them in turn).
     */
    public Prepared prepare(byte[] dataFile, long numRecords) {
        String path = "part-00000-" + UUID.randomUUID() + "-c000.snappy.parquet";
        long written = System.currentTimeMillis();
        // On object storage, step 4's read of _last_checkpoint goes beside the data file's write: one round trip
        // less per commit. A checkpoint that appears meanwhile is found at the next commit, or by the lost race
        // its commits cause; log cleanup removes only commits older than its retention (minutes at least).
        CompletableFuture<Long> checkpointRead = store.isLocal() ? null
                : CompletableFuture.supplyAsync(this::lastCheckpoint, BESIDE);
        store.put(key + "/" + path, dataFile);
        ObjectNode commitInfo = JSON.createObjectNode();
        ObjectNode info = commitInfo.putObject("commitInfo");
        info.put("timestamp", System.currentTimeMillis());
        info.put("operation", "WRITE");
        info.putObject("operationParameters").put("mode", "Append");
        info.put("isBlindAppend", true);
        info.put("engineInfo", ENGINE);
        info.put("clientVersion", ENGINE);
        info.put(PROTOCOL_FIELD, PROTOCOL);
        ObjectNode add = JSON.createObjectNode();
        ObjectNode a = add.putObject("add");
        a.put("path", path);
        a.putObject("partitionValues");
        a.put("size", dataFile.length);
        a.put("modificationTime", written);
        a.put("dataChange", true);
        a.put("stats", "{\"numRecords\":" + numRecords + "}");
        return new Prepared((commitInfo + "\n" + add + "\n").getBytes(StandardCharsets.UTF_8), checkpointRead);
    }

    /** Steps 4 to 8 for a prepared commit: the version it got. One thread at a time. */
    public long commit(Prepared prepared) {
        if (version < 0) {
            load();
        }
        byte[] content = prepared.content;
        int lost = 0;
        while (true) {
            long checkpoint; // step 4: never create a version below a checkpoint
            if (prepared.checkpointRead != null) {
                try {
                    checkpoint = prepared.checkpointRead.join();
                } catch (CompletionException e) {
                    throw e.getCause() instanceof RuntimeException cause ? cause : e;
                } finally {
                    prepared.checkpointRead = null;
                }
            } else {
                checkpoint = lastCheckpoint();
            }
            if (checkpoint > version) {
                version = checkpoint;
                catchUp();
            }
            long next = version + 1;
            long started = System.nanoTime();
            if (store.create(commitKey(next), content)) {
                version = next;
                return next;
            }
            // Step 7: lost the race. Wait about a round trip (doubled per loss in a row, at most 1 s), then read
            // the winners' commits.
            long roundTripMicros = Math.max(100, (System.nanoTime() - started) / 1000);
            long bound = Math.min(1_000_000, roundTripMicros << Math.min(lost, 20));
            lost++;
            sleepMicros(ThreadLocalRandom.current().nextLong(bound / 2, bound + 1));
            // Step 7.2: from the winner's commit up to the first missing one. A create refused as taken whose
            // version does not exist after all (S3's 409 for a competing conditional write that failed too)
            // leaves the version where it was: taking it as made would leave a gap in the log.
            catchUp();
        }
    }

    /** Reads the commits after {@link #version} up to the first missing one, minding protocol/metaData changes. */
    private void catchUp() {
        boolean changed = false;
        while (true) {
            JsonNode[] found = actions(version + 1);
            if (found == null) {
                break;
            }
            changed |= found[0] != null || found[1] != null;
            version++;
        }
        JsonNode[] current = actions(version);
        changed |= current != null && (current[0] != null || current[1] != null);
        if (changed) {
            long known = version;
            load();
            version = Math.max(version, known);
        }
    }

    private static void sleepMicros(long micros) {
        try {
            Thread.sleep(micros / 1000, (int) (micros % 1000) * 1000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CoordinatorException("interrupted while committing", true, true, e);
        }
    }
}
