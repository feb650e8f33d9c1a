package io.txcoord.client.internal;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.txcoord.client.AccessDeniedError;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.zip.CRC32;

/**
 * A producer instance's record, heartbeat and claim of a commit log (docs/protocol.md#instances-claims-and-heartbeats).
 */
public final class Instances {
    public static final int MAX_LOGS = 64;
    private static final int MAX_RECORD_BYTES = 4096;
    private static final Logger LOG = LoggerFactory.getLogger(Instances.class);

    private final ObjectStore store;
    private final String group;
    private final String instanceId;
    private final double heartbeatS;
    private final String host;
    private final long pid;
    private final String pidNamespace;
    private final String started;

    public Instances(ObjectStore store, String group, String instanceId, double heartbeatS) {
        this.store = store;
        this.group = group;
        this.instanceId = instanceId;
        this.heartbeatS = heartbeatS;
        this.host = hostName();
        this.pid = ProcessHandle.current().pid();
        this.pidNamespace = pidNamespace();
        this.started = startTime(pid);
    }

    private static String hostName() {
        try {
            return InetAddress.getLocalHost().getHostName();
        } catch (IOException e) {
            return "unknown";
        }
    }

    private static String pidNamespace() {
        try {
            return Files.readSymbolicLink(Path.of("/proc/self/ns/pid")).toString();
        } catch (IOException | UnsupportedOperationException e) {
            return null;
        }
    }

    /** Field 22 of {@code /proc/<pid>/stat} (the start time, in clock ticks since boot), or null off Linux. */
    static String startTime(long pid) {
        try {
            String stat = Files.readString(Path.of("/proc/" + pid + "/stat"));
            // Fields after the command name (which may hold spaces), from field 3 on.
            String[] fields = stat.substring(stat.lastIndexOf(')') + 2).trim().split(" ");
            return fields[22 - 3];
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    public static String logKey(String group, int number) {
        return "groups/" + group + "/commit_log" + (number == 0 ? "" : "." + number);
    }

    private String recordKey(String instance) {
        return "groups/" + group + "/_producers/" + instance + ".json";
    }

    private String claimKey(int number) {
        return "groups/" + group + "/_producers/commit_log." + number + ".claim";
    }

    /** Writes (or renews) this instance's record. */
    public void announce() {
        ObjectNode record = DeltaLog.JSON.createObjectNode();
        record.put("group", group);
        record.put("instance_id", instanceId);
        record.put("host", host);
        record.put("pid", pid);
        if (pidNamespace != null) {
            record.put("pid_namespace", pidNamespace);
        } else {
            record.putNull("pid_namespace");
        }
        if (started != null) {
            record.put("started", started);
        } else {
            record.putNull("started");
        }
        record.put("last_seen", System.currentTimeMillis() / 1000.0);
        record.put("heartbeat_s", heartbeatS);
        store.put(recordKey(instanceId), record.toString().getBytes(StandardCharsets.UTF_8));
    }

    /** Deletes this instance's record. */
    public void withdraw() {
        store.delete(recordKey(instanceId));
    }

    /** Whether {@code instance}'s record says it is live (and, on this host and pid namespace, its process runs). */
    boolean live(String instance) {
        ObjectStore.Versioned file = store.read(recordKey(instance));
        if (file == null || file.data().length > MAX_RECORD_BYTES) {
            return false;
        }
        try {
            JsonNode record = DeltaLog.JSON.readTree(file.data());
            double lastSeen = record.path("last_seen").asDouble(Double.NaN);
            double heartbeat = record.path("heartbeat_s").asDouble(Double.NaN);
            if (!Double.isFinite(lastSeen) || !Double.isFinite(heartbeat) || heartbeat <= 0) {
                return false;
            }
            if (System.currentTimeMillis() / 1000.0 - lastSeen > 3 * heartbeat) {
                return false;
            }
            JsonNode startedThere = record.get("started");
            if (host.equals(record.path("host").asText()) && pidNamespace != null
                    && pidNamespace.equals(record.path("pid_namespace").asText(null))
                    && startedThere != null && startedThere.isTextual()) {
                return startedThere.asText().equals(startTime(record.path("pid").asLong(-1)));
            }
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    private byte[] claim() {
        return ("{\"instance_id\": \"" + instanceId + "\"}").getBytes(StandardCharsets.UTF_8);
    }

    /** Claims a commit log (step 1 to 2 of docs/protocol.md's claiming): its number. */
    public int claimLog() {
        for (int n = 0; n < MAX_LOGS; n++) {
            if (tryClaim(n)) {
                return n;
            }
        }
        CRC32 crc = new CRC32();
        crc.update(instanceId.getBytes(StandardCharsets.UTF_8));
        int shared = (int) (crc.getValue() % MAX_LOGS);
        LOG.warn("every commit log of group " + group + " is claimed: this instance shares log " + shared);
        return shared;
    }

    private boolean tryClaim(int n) {
        String key = claimKey(n);
        for (int attempt = 0; attempt < 3; attempt++) {
            ObjectStore.Versioned current = store.read(key);
            if (current == null) {
                if (store.create(key, claim())) {
                    return true;
                }
                continue; // taken meanwhile: look at who took it
            }
            if (current.data().length > MAX_RECORD_BYTES) {
                return false;
            }
            String holder = null;
            try {
                JsonNode parsed = DeltaLog.JSON.readTree(current.data());
                if (parsed != null && parsed.isObject() && parsed.path("instance_id").isTextual()) {
                    holder = parsed.get("instance_id").asText();
                }
            } catch (IOException e) {
                holder = null;
            }
            if (instanceId.equals(holder)) {
                return true;
            }
            if (holder != null && live(holder)) {
                return false;
            }
            if (store.replace(key, claim(), current.etag())) {
                return true;
            }
        }
        return false;
    }

    /** Deletes the claim of log {@code n} if it still names this instance. */
    public void releaseLog(int n) {
        String key = claimKey(n);
        try {
            ObjectStore.Versioned current = store.read(key);
            if (current == null) {
                return;
            }
            JsonNode parsed = DeltaLog.JSON.readTree(current.data());
            if (parsed != null && instanceId.equals(parsed.path("instance_id").asText(null))) {
                store.delete(key);
            }
        } catch (IOException | AccessDeniedError e) {
            LOG.warn("releasing the claim " + key + ": " + e.getMessage());
        }
    }
}
