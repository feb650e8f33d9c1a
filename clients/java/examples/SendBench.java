// A load of sends from many threads, for the figures in docs/performance-log.md#java-client and bench/java_producer.py:
// each thread sends one-message transactions (local state COMMIT_MESSAGE) back to back, either a share of
// --sends each or for --seconds, after a warm-up of --warmup-seconds with the same threads (class loading and the
// JIT; not counted). The run prints one JSON line: committed transactions a second, send latency percentiles;
// with --ids FILE it writes every transaction id it sent (warm-up included), one a line, so that the commit log
// can be checked against them.
//
//   java -cp "target/txcoord-client-0.1.0.jar:target/lib/*:target/examples-lib/*" examples/SendBench.java \
//       --config /tmp/bench.toml --threads 64 --seconds 10 --warmup-seconds 3
import io.txcoord.client.CoordinatorConfig;
import io.txcoord.client.LocalTransactionState;
import io.txcoord.client.Message;
import io.txcoord.client.MessageExt;
import io.txcoord.client.TransactionListener;
import io.txcoord.client.TransactionProducer;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public class SendBench {
    static final byte[] BODY = "{\"order\": 1, \"padding\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}"
            .getBytes(StandardCharsets.UTF_8);

    public static void main(String[] args) throws Exception {
        Path config = null;
        Path ids = null;
        int threads = 1;
        int sends = 100;
        double seconds = 0;
        double warmupSeconds = 0;
        String group = "bench_group";
        for (int i = 0; i < args.length; i += 2) {
            switch (args[i]) {
                case "--config" -> config = Path.of(args[i + 1]);
                case "--threads" -> threads = Integer.parseInt(args[i + 1]);
                case "--sends" -> sends = Integer.parseInt(args[i + 1]);
                case "--seconds" -> seconds = Double.parseDouble(args[i + 1]);
                case "--warmup-seconds" -> warmupSeconds = Double.parseDouble(args[i + 1]);
                case "--group" -> group = args[i + 1];
                case "--ids" -> ids = Path.of(args[i + 1]);
                default -> throw new IllegalArgumentException(args[i]);
            }
        }
        TransactionListener listener = new TransactionListener() {
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        };
        ConcurrentLinkedQueue<String> sent = new ConcurrentLinkedQueue<>();
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        List<Long> all = new ArrayList<>();
        double elapsed;
        try (TransactionProducer producer = new TransactionProducer(group, listener, CoordinatorConfig.load(config))) {
            producer.start();
            for (int i = 0; i < 20; i++) {
                sent.add(producer.sendMessageInTransaction(new Message("BENCH", BODY), null).getTransactionId());
            }
            if (warmupSeconds > 0) {
                round(pool, producer, threads, Integer.MAX_VALUE, warmupSeconds, sent);
            }
            long start = System.nanoTime();
            all = round(pool, producer, threads, seconds > 0 ? Integer.MAX_VALUE : sends, seconds, sent);
            elapsed = (System.nanoTime() - start) / 1e9;
        } finally {
            pool.shutdown();
        }
        if (ids != null) {
            Files.write(ids, sent);
        }
        Collections.sort(all);
        System.out.printf("{\"client\":\"java\",\"threads\":%d,\"transactions\":%d,\"sent\":%d,\"seconds\":%.3f,"
                        + "\"txn_per_s\":%.1f,\"p50_ms\":%.2f,\"p99_ms\":%.2f}%n", threads, all.size(), sent.size(),
                elapsed, all.size() / elapsed, all.get(all.size() / 2) / 1e6,
                all.get(Math.min(all.size() - 1, (int) (all.size() * 0.99))) / 1e6);
    }

    /** {@code threads} threads each sending {@code each} transactions or until {@code seconds} (if above 0) pass;
     * returns every send's latency in ns and adds each transaction id to {@code sent}. */
    static List<Long> round(ExecutorService pool, TransactionProducer producer, int threads, int each, double seconds,
                            ConcurrentLinkedQueue<String> sent) throws Exception {
        long stopAt = seconds > 0 ? System.nanoTime() + (long) (seconds * 1e9) : Long.MAX_VALUE;
        List<Future<List<Long>>> futures = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            futures.add(pool.submit(() -> {
                List<Long> latencies = new ArrayList<>();
                for (int i = 0; i < each && System.nanoTime() < stopAt; i++) {
                    long t0 = System.nanoTime();
                    String id = producer.sendMessageInTransaction(new Message("BENCH", BODY), null).getTransactionId();
                    latencies.add(System.nanoTime() - t0);
                    sent.add(id);
                }
                return latencies;
            }));
        }
        List<Long> all = new ArrayList<>();
        for (Future<List<Long>> f : futures) {
            all.addAll(f.get());
        }
        return all;
    }
}
