package io.txcoord.client.internal;

import io.txcoord.client.LocalTransactionState;
import io.txcoord.client.StorageUnavailableError;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The instance's heartbeat against storage that stalls its reads: the check-request follower's read hangs (as one
 * S3 request retried for up to a minute would), and the record must go on being renewed meanwhile. A store of its
 * own here, not the S3 server: a read held until the test lets it go makes "renewed while a read is in progress"
 * a fact to assert, where a proxy's delay would only make it likely (tests/test_java_client_storage.py runs the same
 * against the S3 server through the fault proxy).
 */
class HeartbeatTest {
    @TempDir
    Path lakehouse;

    /** A local store whose reads, once {@code stall} is set, wait for {@code release}; it counts the record's puts. */
    static final class StallingReads implements ObjectStore {
        final LocalStore inner;
        final String recordKey;
        volatile boolean stall;
        final CountDownLatch release = new CountDownLatch(1);
        final CountDownLatch readStalled = new CountDownLatch(1);
        final AtomicInteger readsInProgress = new AtomicInteger();
        final Semaphore recordPuts = new Semaphore(0);
        final AtomicInteger putsToFail = new AtomicInteger();

        StallingReads(LocalStore inner, String recordKey) {
            this.inner = inner;
            this.recordKey = recordKey;
        }

        private void maybeStall() {
            if (!stall) {
                return;
            }
            readsInProgress.incrementAndGet();
            readStalled.countDown();
            try {
                release.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new StorageUnavailableError("interrupted", e);
            } finally {
                readsInProgress.decrementAndGet();
            }
        }

        @Override
        public Versioned read(String key) {
            maybeStall();
            return inner.read(key);
        }

        @Override
        public boolean exists(String key) {
            maybeStall();
            return inner.exists(key);
        }

        @Override
        public List<String> list(String key) {
            maybeStall();
            return inner.list(key);
        }

        @Override
        public void put(String key, byte[] data) {
            if (key.equals(recordKey) && putsToFail.getAndUpdate(n -> Math.max(0, n - 1)) > 0) {
                throw new StorageUnavailableError(key + ": put failed (the test's)", null);
            }
            inner.put(key, data);
            if (key.equals(recordKey)) {
                recordPuts.release();
            }
        }

        @Override
        public boolean create(String key, byte[] data) {
            return inner.create(key, data);
        }

        @Override
        public boolean replace(String key, byte[] data, String etag) {
            return inner.replace(key, data, etag);
        }

        @Override
        public void delete(String key) {
            inner.delete(key);
        }

        @Override
        public boolean isLocal() {
            return true;
        }

        @Override
        public String location(String key) {
            return inner.location(key);
        }

        @Override
        public void close() {
            inner.close();
        }
    }

    @Test
    void theRecordIsRenewedWhileAReadOfCheckRequestsStalls() throws Exception {
        LocalStore local = new LocalStore(lakehouse.toString());
        String instance = "i-heartbeat";
        Path record = lakehouse.resolve("groups/order_group/_producers/" + instance + ".json");
        StallingReads store = new StallingReads(local, "groups/order_group/_producers/" + instance + ".json");
        DeltaLog log = new DeltaLog(local, Instances.logKey("order_group", 0));
        log.createIfMissing(Records.SCHEMA_STRING, Records.CONFIGURATION);
        CommitLogWriter writer = new CommitLogWriter(local, log, 10, null);
        Instances instances = new Instances(store, "order_group", instance, 0.02);
        instances.announce();
        store.recordPuts.drainPermits();
        store.putsToFail.set(1); // the first renewal fails: the next ones must still come
        store.stall = true;
        CheckBackWorker worker = new CheckBackWorker(store, "order_group", instance,
                CheckBackTest.checking(msg -> LocalTransactionState.COMMIT_MESSAGE), writer, instances, 20,
                60_000, null);
        worker.start();
        try {
            assertTrue(store.readStalled.await(30, TimeUnit.SECONDS), "the follower never read check_requests");
            assertTrue(store.recordPuts.tryAcquire(3, 30, TimeUnit.SECONDS),
                    "the record was not renewed three times while the follower's read stalled");
            assertEquals(1, store.readsInProgress.get(), "the read was still stalled while the record was renewed");
            assertEquals(0, store.putsToFail.get());
        } finally {
            store.release.countDown();
            worker.stop();
            writer.close();
        }
        // Withdrawn once the renewals have ended: none lands after it.
        assertFalse(Files.exists(record));
    }
}
