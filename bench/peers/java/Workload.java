import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicIntegerArray;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * The workload every peer runs, and its bookkeeping: the same plan as bench/peers/workload.py.
 *
 * Transaction k carries one message whose body is k in ten digits padded with 'x' to the body
 * size; its outcome is planned by k mod 100 (the first commit-percent commit, the next
 * rollback-percent roll back, the rest stay unknown). Threads take transactions in order, each
 * at t0 + k / rate when a rate is given. Per transaction it records when the producer call
 * started and returned, when a check-back resolved it, and when a consumer first saw it and how
 * often; results are written as CSV for bench/peers/run.py to turn into figures.
 */
final class Workload {
    enum Outcome { COMMIT, ROLLBACK, UNKNOWN }

    /** One system's side: a consumer callback and a blocking transaction per call. */
    interface Peer extends AutoCloseable {
        /** Create the topic, start consuming (reporting deliveries to the workload), be ready to send. */
        void start(Workload workload) throws Exception;

        /** Run transaction {@code index} from sender {@code thread}; return when the producer call returns. */
        void transact(int thread, int index, byte[] body, Outcome outcome) throws Exception;
    }

    final Map<String, String> options;
    final int transactions;
    final int threads;
    final double rate;
    final int commitPercent;
    final int rollbackPercent;
    final int bodyBytes;
    final String topic;
    private final long t0 = System.nanoTime();
    private final AtomicLongArray started;
    private final AtomicLongArray returned;
    private final AtomicLongArray resolvedByCheck;
    private final AtomicLongArray firstSeen;
    private final AtomicIntegerArray deliveries;
    private final AtomicIntegerArray checks;
    private final AtomicInteger errors = new AtomicInteger();
    private final AtomicInteger foreign = new AtomicInteger();
    private final AtomicInteger probesSeen = new AtomicInteger();
    private static final byte[] PROBE = "probe".getBytes(StandardCharsets.US_ASCII);

    Workload(String[] args) {
        options = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
            }
            options.put(args[i].substring(2), args[i + 1]);
        }
        transactions = Integer.parseInt(option("transactions"));
        threads = Integer.parseInt(option("threads"));
        rate = Double.parseDouble(option("rate"));
        commitPercent = Integer.parseInt(option("commit-percent"));
        rollbackPercent = Integer.parseInt(option("rollback-percent"));
        bodyBytes = Integer.parseInt(option("body-bytes"));
        topic = option("topic");
        started = new AtomicLongArray(transactions);
        returned = new AtomicLongArray(transactions);
        resolvedByCheck = new AtomicLongArray(transactions);
        firstSeen = new AtomicLongArray(transactions);
        deliveries = new AtomicIntegerArray(transactions);
        checks = new AtomicIntegerArray(transactions);
    }

    String option(String name) {
        String value = options.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }

    /** The name of the local transaction state an outcome is, in RocketMQ's LocalTransactionState and in ours alike. */
    static String stateName(Outcome outcome) {
        return switch (outcome) {
            case COMMIT -> "COMMIT_MESSAGE";
            case ROLLBACK -> "ROLLBACK_MESSAGE";
            case UNKNOWN -> "UNKNOW";
        };
    }

    Outcome outcomeOf(int index) {
        int slot = index % 100;
        if (slot < commitPercent) {
            return Outcome.COMMIT;
        }
        return slot < commitPercent + rollbackPercent ? Outcome.ROLLBACK : Outcome.UNKNOWN;
    }

    byte[] bodyOf(int index) {
        StringBuilder body = new StringBuilder(String.format("%010d", index));
        while (body.length() < bodyBytes) {
            body.append('x');
        }
        return body.toString().getBytes(StandardCharsets.US_ASCII);
    }

    /** The transaction index in a body this workload wrote, or -1 for anything else. */
    int indexOf(byte[] body) {
        if (body == null || body.length != bodyBytes) {
            return -1;
        }
        try {
            int index = Integer.parseInt(new String(body, 0, 10, StandardCharsets.US_ASCII));
            return index >= 0 && index < transactions ? index : -1;
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    private long now() {
        return System.nanoTime() - t0 + 1;  // +1: zero means "never" in the arrays
    }

    /** t0 on the wall clock, in ms since the epoch: where a delivery's time from another clock (a commit's) falls. */
    double t0EpochMs() {
        return System.currentTimeMillis() - (System.nanoTime() - t0) / 1e6;
    }

    /** Producer calls that threw. */
    int errors() {
        return errors.get();
    }

    /** Deliveries and check-backs of messages this workload did not send. */
    int foreign() {
        return foreign.get();
    }

    /** A consumer saw the message with this body. */
    void delivered(byte[] body) {
        if (Arrays.equals(body, PROBE)) {
            probesSeen.incrementAndGet();
            return;
        }
        int index = indexOf(body);
        if (index < 0) {
            foreign.incrementAndGet();
            return;
        }
        firstSeen.compareAndSet(index, 0, now());
        deliveries.incrementAndGet(index);
    }

    /**
     * Send one probe message (not part of the plan) with {@code send} and wait until the consumer has seen it,
     * so that no system's consumer start-up (rebalancing, first fetch) is timed as delivery latency.
     */
    void awaitConsumer(ProbeSender send) throws Exception {
        double seconds = Double.parseDouble(option("ready-seconds"));
        long deadline = System.nanoTime() + (long) (seconds * 1e9);
        while (true) {
            try {
                send.send(PROBE);
                break;
            } catch (Exception notYet) {  // e.g. RocketMQ: the new topic's route is not on the name server yet
                if (System.nanoTime() > deadline) {
                    throw notYet;
                }
                Thread.sleep(200);
            }
        }
        while (probesSeen.get() == 0) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("the consumer did not receive a probe message within " + seconds + " s");
            }
            Thread.sleep(20);
        }
    }

    interface ProbeSender {
        void send(byte[] body) throws Exception;
    }

    /** A check-back asked about the message with this body; returns its planned answer. */
    Outcome checked(byte[] body) {
        int index = indexOf(body);
        if (index < 0) {
            foreign.incrementAndGet();
            return Outcome.ROLLBACK;
        }
        checks.incrementAndGet(index);
        Outcome planned = outcomeOf(index);
        Outcome answer = planned == Outcome.UNKNOWN ? Outcome.COMMIT : planned;
        if (answer == Outcome.COMMIT) {
            resolvedByCheck.compareAndSet(index, 0, now());
        }
        return answer;
    }

    /** Transactions a consumer must end up seeing: every commit, and every unknown when check-back commits it. */
    int expectedDeliveries(boolean checkBack) {
        int expected = 0;
        for (int i = 0; i < transactions; i++) {
            Outcome outcome = outcomeOf(i);
            if (outcome == Outcome.COMMIT || (checkBack && outcome == Outcome.UNKNOWN)) {
                expected++;
            }
        }
        return expected;
    }

    private int seen() {
        int seen = 0;
        for (int i = 0; i < transactions; i++) {
            if (deliveries.get(i) > 0) {
                seen++;
            }
        }
        return seen;
    }

    /** Send every transaction from {@code threads} threads; returns the sending seconds. */
    double send(Peer peer) throws InterruptedException {
        AtomicInteger next = new AtomicInteger();
        long sendStart = System.nanoTime();
        List<Thread> senders = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int thread = t;
            Thread sender = new Thread(() -> {
                int k;
                while ((k = next.getAndIncrement()) < transactions) {
                    if (rate > 0) {
                        long due = sendStart + (long) (k / rate * 1e9);
                        long wait = due - System.nanoTime();
                        if (wait > 0) {
                            try {
                                Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                            } catch (InterruptedException e) {
                                return;
                            }
                        }
                    }
                    byte[] body = bodyOf(k);
                    started.set(k, now());
                    try {
                        peer.transact(thread, k, body, outcomeOf(k));
                        returned.set(k, now());
                    } catch (Exception e) {
                        if (errors.incrementAndGet() <= 5) {
                            e.printStackTrace();
                        }
                    }
                }
            }, "sender-" + t);
            senders.add(sender);
            sender.start();
        }
        for (Thread sender : senders) {
            sender.join();
        }
        return (System.nanoTime() - sendStart) / 1e9;
    }

    /**
     * Wait until every expected message was seen or {@code drainSeconds} passed, then {@code graceSeconds}
     * more so that a late duplicate or a rolled-back message that leaks is counted too.
     */
    double drain(int expected, double drainSeconds, double graceSeconds) throws InterruptedException {
        long start = System.nanoTime();
        long deadline = start + (long) (drainSeconds * 1e9);
        while (seen() < expected && System.nanoTime() < deadline) {
            Thread.sleep(50);
        }
        double drained = (System.nanoTime() - start) / 1e9;
        Thread.sleep((long) (graceSeconds * 1000));
        return drained;
    }

    /** Per transaction: outcome, and start/return/check/first-seen times in ms from t0 (blank: never), deliveries, checks. */
    void writeCsv(Path path) throws IOException {
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(path))) {
            out.println("index,outcome,started_ms,returned_ms,resolved_by_check_ms,first_seen_ms,deliveries,checks");
            for (int i = 0; i < transactions; i++) {
                out.printf("%d,%s,%s,%s,%s,%s,%d,%d%n", i, outcomeOf(i).name().toLowerCase(), ms(started.get(i)),
                        ms(returned.get(i)), ms(resolvedByCheck.get(i)), ms(firstSeen.get(i)), deliveries.get(i),
                        checks.get(i));
            }
        }
    }

    private static String ms(long nanos) {
        return nanos == 0 ? "" : String.format("%.3f", nanos / 1e6);
    }

    /** The whole run for one peer: start, send, drain, write; prints a one-line JSON summary. */
    static void run(Workload workload, Peer peer, boolean checkBack) throws Exception {
        try (peer) {
            peer.start(workload);
            double sendSeconds = workload.send(peer);
            int expected = workload.expectedDeliveries(checkBack);
            double drained = workload.drain(expected, Double.parseDouble(workload.option("drain-seconds")),
                    Double.parseDouble(workload.option("grace-seconds")));
            workload.writeCsv(Path.of(workload.option("out")));
            System.out.printf("{\"send_seconds\": %.3f, \"drained_after_s\": %.3f, \"errors\": %d, \"foreign_messages\": %d}%n",
                    sendSeconds, drained, workload.errors(), workload.foreign());
        }
    }
}
