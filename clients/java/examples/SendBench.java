// A load of sends from many threads, for the figures in docs/performance.md#java-client: each thread sends its
// share of one-message transactions (local state COMMIT_MESSAGE) back to back, and the run prints one JSON
// line: committed transactions a second, send latency percentiles and the commits the log took.
//
//   java -cp "target/txcoord-client-0.1.0.jar:target/lib/*" examples/SendBench.java \
//       --config /tmp/bench.toml --threads 64 --sends 50
import io.txcoord.client.CoordinatorConfig;
import io.txcoord.client.LocalTransactionState;
import io.txcoord.client.Message;
import io.txcoord.client.MessageExt;
import io.txcoord.client.TransactionListener;
import io.txcoord.client.TransactionProducer;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public class SendBench {
    public static void main(String[] args) throws Exception {
        Path config = null;
        int threads = 1;
        int sends = 100;
        String group = "bench_group";
        for (int i = 0; i < args.length; i += 2) {
            switch (args[i]) {
                case "--config" -> config = Path.of(args[i + 1]);
                case "--threads" -> threads = Integer.parseInt(args[i + 1]);
                case "--sends" -> sends = Integer.parseInt(args[i + 1]);
                case "--group" -> group = args[i + 1];
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
        byte[] body = "{\"order\": 1, \"padding\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}".getBytes(StandardCharsets.UTF_8);
        try (TransactionProducer producer = new TransactionProducer(group, listener, CoordinatorConfig.load(config))) {
            producer.start();
            for (int i = 0; i < 20; i++) { // warm-up: class loading and the JIT, not measured
                producer.sendMessageInTransaction(new Message("BENCH", body), null);
            }
            ExecutorService pool = Executors.newFixedThreadPool(threads);
            List<Future<List<Long>>> futures = new ArrayList<>();
            int each = sends;
            long start = System.nanoTime();
            for (int t = 0; t < threads; t++) {
                futures.add(pool.submit(() -> {
                    List<Long> latencies = new ArrayList<>(each);
                    for (int i = 0; i < each; i++) {
                        long t0 = System.nanoTime();
                        producer.sendMessageInTransaction(new Message("BENCH", body), null);
                        latencies.add(System.nanoTime() - t0);
                    }
                    return latencies;
                }));
            }
            List<Long> all = new ArrayList<>();
            for (Future<List<Long>> f : futures) {
                all.addAll(f.get());
            }
            double seconds = (System.nanoTime() - start) / 1e9;
            pool.shutdown();
            Collections.sort(all);
            System.out.printf("{\"client\":\"java\",\"threads\":%d,\"transactions\":%d,\"seconds\":%.2f,\"txn_per_s\":%.0f,"
                            + "\"p50_ms\":%.2f,\"p99_ms\":%.2f}%n", threads, all.size(), seconds, all.size() / seconds,
                    all.get(all.size() / 2) / 1e6, all.get((int) (all.size() * 0.99)) / 1e6);
        }
    }
}
