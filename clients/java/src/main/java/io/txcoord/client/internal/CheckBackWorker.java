package io.txcoord.client.internal;

import com.fasterxml.jackson.databind.JsonNode;
import io.txcoord.client.LocalTransactionState;
import io.txcoord.client.MessageExt;
import io.txcoord.client.ProducerStateError;
import io.txcoord.client.TransactionListener;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Follows the group's {@code check_requests} table and answers each request addressed to this instance (or to no
 * instance) once, with an END carrying the request's {@code check_id} in this instance's own commit log
 * (docs/protocol.md#check-requests-and-answers). Renews the instance's record every heartbeat while it runs, on a
 * thread of its own: a read of the table that the storage stalls (retried up to {@code [storage] retry_timeout})
 * must not outlast the liveness window (three heartbeats), or the checker would address this instance's checks
 * to others and its commit log would be claimable.
 */
public final class CheckBackWorker {
    private static final Logger LOG = LoggerFactory.getLogger(CheckBackWorker.class);
    private static final int REMEMBERED_CHECKS = 100_000;
    private static final long POLL_MS = 200;
    private static final long RESYNC_MS = 10_000;

    private final ObjectStore store;
    private final String group;
    private final String instanceId;
    private final TransactionListener listener;
    private final CommitLogWriter writer;
    private final Instances instances;
    private final long heartbeatMs;
    private final long checkIntervalMs;
    private final String table;
    private final Map<String, Boolean> answered = new LinkedHashMap<>(1024, 0.75f, false) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, Boolean> eldest) {
            return size() > REMEMBERED_CHECKS;
        }
    };
    private final ExecutorService pool;
    private final Thread thread;
    private final ScheduledExecutorService heartbeat;
    private volatile boolean stopping;
    private long version = -1;
    private boolean waitedForTable;
    private long syncedAt;

    /**
     * {@code checkExecutor} runs the listener's {@code checkLocalTransaction} calls ({@code null}: a pool of 4 threads of
     * its own); {@link #stop()} shuts it down either way, as RocketMQ's producer does the executor it is given.
     */
    public CheckBackWorker(ObjectStore store, String group, String instanceId, TransactionListener listener,
                           CommitLogWriter writer, Instances instances, long heartbeatMs, long checkIntervalMs,
                           ExecutorService checkExecutor) {
        this.store = store;
        this.group = group;
        this.instanceId = instanceId;
        this.listener = listener;
        this.writer = writer;
        this.instances = instances;
        this.heartbeatMs = heartbeatMs;
        this.checkIntervalMs = checkIntervalMs;
        this.table = "groups/" + group + "/check_requests";
        AtomicInteger n = new AtomicInteger();
        this.pool = checkExecutor != null ? checkExecutor : Executors.newFixedThreadPool(4, r -> {
            Thread t = new Thread(r, "txcoord-checkback-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
        this.thread = new Thread(this::run, "txcoord-checkback-follower");
        this.thread.setDaemon(true);
        this.heartbeat = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "txcoord-heartbeat");
            t.setDaemon(true);
            return t;
        });
    }

    /** Starts following; the record, announced by the producer's start, is renewed every heartbeat from now on. */
    public void start() {
        // With a fixed delay, not rate: a renewal that the storage held up is not followed by a burst of others.
        heartbeat.scheduleWithFixedDelay(this::renew, heartbeatMs, heartbeatMs, TimeUnit.MILLISECONDS);
        thread.start();
    }

    private void renew() {
        try {
            instances.announce();
        } catch (RuntimeException e) {
            // A task that throws is never run again: the next heartbeat tries anew.
            LOG.warn("renewing the record of instance {} failed: {}", instanceId, e.toString());
        }
    }

    /** Stops following and withdraws the instance's record; waits for the checks in progress. */
    public void stop() {
        stopping = true;
        thread.interrupt();
        // Not interrupted: a renewal under way ends (bounded by the storage's retries) before the record is
        // withdrawn, so that none lands after the withdrawal and leaves a live-looking record behind.
        heartbeat.shutdown();
        try {
            thread.join();
            heartbeat.awaitTermination(Long.MAX_VALUE, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        try {
            instances.withdraw();
        } finally {
            pool.shutdown();
            try {
                pool.awaitTermination(30, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private void run() {
        while (!stopping) {
            try {
                poll();
            } catch (RuntimeException e) {
                LOG.warn("reading {} failed: {}", table, e.toString());
                version = -1; // start again from the recent requests
            }
            try {
                Thread.sleep(POLL_MS);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    private String commitKey(long v) {
        return table + "/_delta_log/" + DeltaLog.commitName(v);
    }

    private void poll() {
        if (version < 0) {
            if (!store.exists(commitKey(0)) && !store.exists(table + "/_delta_log/_last_checkpoint")) {
                waitedForTable = true;
                return;
            }
            open();
            return;
        }
        boolean resync = System.currentTimeMillis() - syncedAt >= RESYNC_MS;
        if (!resync && !store.exists(commitKey(version + 1))) {
            return;
        }
        syncedAt = System.currentTimeMillis();
        boolean any = false;
        while (!stopping) {
            Commit commit = readCommit(version + 1);
            if (commit == null) {
                break;
            }
            any = true;
            for (String file : commit.added) {
                dispatch(file, null);
            }
            version++;
        }
        if (!any && resync) {
            // Log cleanup may have removed the versions after the last one read: go on from the checkpoint.
            long checkpoint = lastCheckpoint();
            if (checkpoint > version + 1) {
                LOG.warn(table + ": versions " + (version + 1) + " to " + checkpoint + " are gone; going on from "
                        + checkpoint + " (the checker asks again)");
                version = checkpoint;
            }
        }
    }

    /** The first read: the requests of the last check interval, or every one if the table appeared while running. */
    private void open() {
        long latest = -1;
        for (String name : store.list(table + "/_delta_log")) {
            if (name.matches("[0-9]{20}\\.json")) {
                latest = Math.max(latest, Long.parseLong(name.substring(0, 20)));
            }
        }
        latest = Math.max(latest, lastCheckpoint());
        Instant cutoff = waitedForTable ? null : Instant.now().minusMillis(checkIntervalMs);
        long since = cutoff == null ? Long.MIN_VALUE : cutoff.toEpochMilli() - 5_000;
        // The requests of the window are in commits made within it (requested_at precedes its commit): read
        // back from the latest commit while commits are that recent.
        List<String> files = new ArrayList<>();
        Set<String> removed = new LinkedHashSet<>();
        for (long v = latest; v >= 0; v--) {
            Commit commit = readCommit(v);
            if (commit == null || commit.modifiedMs < since) {
                break;
            }
            removed.addAll(commit.removed);
            for (String f : commit.added) {
                if (!removed.contains(f)) {
                    files.add(f);
                }
            }
        }
        for (String f : files) {
            dispatch(f, cutoff);
        }
        version = latest;
        syncedAt = System.currentTimeMillis();
    }

    private long lastCheckpoint() {
        ObjectStore.Versioned last = store.read(table + "/_delta_log/_last_checkpoint");
        if (last == null) {
            return -1;
        }
        try {
            return DeltaLog.JSON.readTree(last.data()).path("version").asLong(-1);
        } catch (IOException e) {
            return -1;
        }
    }

    private record Commit(List<String> added, List<String> removed, long modifiedMs) {
    }

    private Commit readCommit(long v) {
        ObjectStore.Versioned file = store.read(commitKey(v));
        if (file == null) {
            return null;
        }
        List<String> added = new ArrayList<>();
        List<String> removed = new ArrayList<>();
        for (String line : new String(file.data(), StandardCharsets.UTF_8).split("\n")) {
            if (line.isBlank()) {
                continue;
            }
            try {
                JsonNode action = DeltaLog.JSON.readTree(line);
                JsonNode add = action.get("add");
                if (add != null && add.path("dataChange").asBoolean(true)) {
                    added.add(URLDecoder.decode(add.path("path").asText(), StandardCharsets.UTF_8));
                }
                JsonNode remove = action.get("remove");
                if (remove != null) {
                    removed.add(URLDecoder.decode(remove.path("path").asText(), StandardCharsets.UTF_8));
                }
            } catch (IOException e) {
                LOG.warn(table + " commit " + v + " has a line that is not JSON: skipped");
            }
        }
        return new Commit(added, removed, file.modifiedMs());
    }

    private void dispatch(String path, Instant cutoff) {
        if (path.startsWith("/") || path.contains("..") || path.contains("://")) {
            LOG.warn(table + ": data file path " + path + " ignored");
            return;
        }
        ObjectStore.Versioned file = store.read(table + "/" + path);
        if (file == null) {
            LOG.debug("{}: data file {} is gone", table, path);
            return;
        }
        List<Map<String, Object>> rows;
        try {
            rows = Parquet.read(file.data());
        } catch (IOException | RuntimeException e) {
            LOG.warn(table + ": data file " + path + " cannot be read: " + e);
            return;
        }
        for (Map<String, Object> row : rows) {
            if (!group.equals(row.get("producer_group"))) {
                continue;
            }
            Object addressed = row.get("producer_instance");
            if (addressed != null && !instanceId.equals(addressed)) {
                continue;
            }
            Object checkId = row.get("check_id");
            if (!(checkId instanceof String id)) {
                LOG.warn("check request without check_id ignored transaction_id=" + row.get("transaction_id"));
                continue;
            }
            if (cutoff != null && row.get("requested_at") instanceof Instant at && at.isBefore(cutoff)) {
                continue;
            }
            synchronized (answered) {
                if (answered.containsKey(id)) {
                    continue;
                }
                answered.put(id, Boolean.TRUE);
            }
            try {
                pool.submit(() -> answer(row));
            } catch (java.util.concurrent.RejectedExecutionException e) {
                return; // stopping
            }
        }
    }

    private void answer(Map<String, Object> request) {
        String transactionId = (String) request.get("transaction_id");
        String checkId = (String) request.get("check_id");
        MessageExt msg = new MessageExt((String) request.get("topic"), (byte[]) request.get("body"));
        msg.setKeys((String) request.get("keys"));
        msg.setTags((String) request.get("tags"));
        if (request.get("properties") instanceof Map<?, ?> properties) {
            properties.forEach((k, v) -> {
                if (k != null && v != null) {
                    msg.getProperties().put(k.toString(), v.toString());
                }
            });
        }
        msg.setTransactionId(transactionId);
        msg.setMsgId((String) request.get("msg_id"));
        msg.setCheckId(checkId);
        if (request.get("check_times") instanceof Number n) {
            msg.setCheckTimes(n.intValue());
        }
        if (request.get("half_offset") instanceof Number n) {
            msg.setQueueOffset(n.longValue());
        }
        if (request.get("born_timestamp") instanceof Instant born) {
            msg.setBornTimestamp(born);
        }
        LocalTransactionState state;
        try {
            state = LocalTransactionState.coerce(listener.checkLocalTransaction(msg));
        } catch (RuntimeException e) {
            LOG.warn("checkLocalTransaction failed transaction_id=" + transactionId + " check_id=" + checkId
                    + "; state UNKNOW", e);
            state = LocalTransactionState.UNKNOW;
        }
        try {
            final LocalTransactionState answeredState = state;
            writer.submit(List.of(Records.end(group, transactionId, state.name(), checkId))).whenComplete((v, e) -> {
                if (e != null) {
                    LOG.warn("check answer not stored transaction_id=" + transactionId + " check_id=" + checkId + ": "
                            + e + "; the checker will ask again");
                } else {
                    LOG.debug("check answered transaction_id={} check_id={} state={}", transactionId, checkId,
                            answeredState);
                }
            });
        } catch (ProducerStateError e) {
            LOG.warn("check answer not sent, writer closed transaction_id=" + transactionId + " check_id=" + checkId);
        }
    }
}
