package io.txcoord.client.internal;

import io.txcoord.client.AccessDeniedError;
import io.txcoord.client.CoordinatorException;
import io.txcoord.client.ProducerStateError;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.Semaphore;

/**
 * Group commit (docs/protocol.md#group-commit): one thread takes everything waiting (up to 5,000 rows and 64 MiB of
 * bodies, never splitting a submit) into one data file, at least {@code commit_interval_ms} after the batch before;
 * a second thread makes their commits in the order taken. On object storage the next batch's data file is written
 * while a commit is in flight (two batches at most); on a local disk one batch is in flight. A submit's future completes with the version that holds its
 * records once the commit is made, or with the commit's error. On object storage it rings the group's doorbell
 * after a commit that follows a quiet spell.
 */
public final class CommitLogWriter implements AutoCloseable {
    public static final int MAX_BATCH_ROWS = 5000;
    public static final long MAX_COMMIT_BODY_BYTES = 64L * 1024 * 1024;
    private static final Logger LOG = LoggerFactory.getLogger(CommitLogWriter.class);
    private static final Object CLOSE = new Object();
    private static final long RING_AFTER_QUIET_MS = 5000;

    private record Submit(List<Records.Record> records, long bodyBytes, CompletableFuture<Long> future) {
    }

    private record Work(DeltaLog.Prepared prepared, List<Submit> batch) {
    }

    private final DeltaLog log;
    private final ObjectStore store;
    private final String doorbellKey;
    private final long commitIntervalNanos;
    private final LinkedBlockingQueue<Object> queue = new LinkedBlockingQueue<>();
    private final Thread thread;
    private final Thread committer;
    private final LinkedBlockingQueue<Object> prepared = new LinkedBlockingQueue<>();
    /** Batches taken and not yet committed: 2 on object storage (the next data file is written while a commit is
     * in flight, as the Python producer does), 1 on a local disk, where a commit takes a fraction of a ms. */
    private final Semaphore inFlight;
    private final Object lock = new Object();
    private boolean closed;
    private boolean doorbellRefused;
    private long lastLandedMs = -1;
    private boolean ringPending;

    /** {@code doorbellKey}: {@code groups/<group>.bell} on object storage, {@code null} on a local disk. */
    public CommitLogWriter(ObjectStore store, DeltaLog log, int commitIntervalMs, String doorbellKey) {
        this.store = store;
        this.log = log;
        this.doorbellKey = doorbellKey;
        this.commitIntervalNanos = commitIntervalMs * 1_000_000L;
        log.load();
        this.inFlight = new Semaphore(store.isLocal() ? 1 : 2);
        this.thread = new Thread(this::run, "txcoord-commit-log-writer");
        this.thread.setDaemon(true);
        this.committer = new Thread(this::commitPrepared, "txcoord-commit-log-committer");
        this.committer.setDaemon(true);
        this.thread.start();
        this.committer.start();
    }

    public DeltaLog log() {
        return log;
    }

    /** Queues {@code records} for the next commit; the future completes with its version. */
    public CompletableFuture<Long> submit(List<Records.Record> records) {
        long bytes = 0;
        for (Records.Record r : records) {
            bytes += r.bodySize();
        }
        if (bytes > MAX_COMMIT_BODY_BYTES) {
            throw new IllegalArgumentException("the records' bodies are " + bytes + " bytes together; one commit holds at most "
                    + MAX_COMMIT_BODY_BYTES);
        }
        CompletableFuture<Long> future = new CompletableFuture<>();
        synchronized (lock) {
            if (closed) {
                throw new ProducerStateError("the commit-log writer is closed");
            }
            queue.add(new Submit(List.copyOf(records), bytes, future));
        }
        return future;
    }

    /** Writes everything already submitted, then stops the writer thread. Idempotent. */
    @Override
    public void close() {
        synchronized (lock) {
            if (!closed) {
                closed = true;
                queue.add(CLOSE);
            }
        }
        try {
            thread.join();
            committer.join();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private void run() {
        Object carried = null;
        long nextCommitAt = System.nanoTime();
        while (true) {
            Object item;
            try {
                inFlight.acquire(); // released once this batch is committed (or given up)
                item = carried != null ? carried : queue.take();
            } catch (InterruptedException e) {
                prepared.add(CLOSE);
                return;
            }
            carried = null;
            if (item == CLOSE) {
                prepared.add(CLOSE);
                return;
            }
            long wait = nextCommitAt - System.nanoTime();
            if (wait > 0) {
                try {
                    Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                } catch (InterruptedException e) {
                    return;
                }
            }
            List<Submit> batch = new ArrayList<>();
            Submit first = (Submit) item;
            batch.add(first);
            int rows = first.records().size();
            long bytes = first.bodyBytes();
            while (rows < MAX_BATCH_ROWS) {
                Object next = queue.poll();
                if (next == null) {
                    break;
                }
                if (next == CLOSE || rows + ((Submit) next).records().size() > MAX_BATCH_ROWS
                        || bytes + ((Submit) next).bodyBytes() > MAX_COMMIT_BODY_BYTES) {
                    carried = next;
                    break;
                }
                Submit s = (Submit) next;
                batch.add(s);
                rows += s.records().size();
                bytes += s.bodyBytes();
            }
            nextCommitAt = System.nanoTime() + commitIntervalNanos;
            prepare(batch, rows);
        }
    }

    /** Writes the batch's data file and queues its commit, or fails the batch's submits. */
    private void prepare(List<Submit> batch, int rows) {
        List<Records.Record> records = new ArrayList<>(rows);
        for (Submit s : batch) {
            records.addAll(s.records());
        }
        try {
            prepared.add(new Work(log.prepare(Records.toParquet(records), records.size()), batch));
        } catch (Throwable e) {
            fail(batch, e);
            inFlight.release();
        }
    }

    /** The committer thread: the prepared batches' commits, in the order they were taken. */
    private void commitPrepared() {
        while (true) {
            Object item;
            try {
                item = prepared.take();
            } catch (InterruptedException e) {
                return;
            }
            if (item == CLOSE) {
                return;
            }
            Work work = (Work) item;
            try {
                long version = log.commit(work.prepared());
                for (Submit s : work.batch()) {
                    s.future().complete(version);
                }
                ring();
            } catch (Throwable e) {
                fail(work.batch(), e);
            } finally {
                inFlight.release();
            }
        }
    }

    private static void fail(List<Submit> batch, Throwable e) {
        Throwable error = e instanceof CoordinatorException ? e
                : new CoordinatorException("writing the commit log failed: " + e, false, false, e);
        LOG.warn("commit-log append failed for " + batch.size() + " submits: " + e);
        for (Submit s : batch) {
            s.future().completeExceptionally(error);
        }
    }

    /** docs/protocol.md#doorbells: after a first commit, or one after more than 5 s of quiet, or a failed ring. */
    private void ring() {
        if (doorbellKey == null || doorbellRefused) {
            return;
        }
        long now = System.currentTimeMillis();
        boolean due = ringPending || lastLandedMs < 0 || now - lastLandedMs > RING_AFTER_QUIET_MS;
        lastLandedMs = now;
        if (!due) {
            return;
        }
        try {
            store.put(doorbellKey, Records.randomHex(16).getBytes(StandardCharsets.US_ASCII));
            ringPending = false;
        } catch (AccessDeniedError e) {
            doorbellRefused = true;
            LOG.warn("the doorbell " + doorbellKey + " is refused (" + e.getMessage() + "): the checker finds this "
                    + "group's commits within about a minute after a quiet spell");
        } catch (RuntimeException e) {
            ringPending = true;
            LOG.debug("ringing the doorbell failed, retried after the next commit: {}", e.toString());
        }
    }
}
