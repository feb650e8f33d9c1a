import java.io.IOException;
import java.io.PrintWriter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

import io.txcoord.client.CoordinatorConfig;
import io.txcoord.client.LocalTransactionState;
import io.txcoord.client.Message;
import io.txcoord.client.MessageExt;
import io.txcoord.client.TransactionListener;
import io.txcoord.client.TransactionProducer;
import io.txcoord.client.TransactionSendResult;

/**
 * The workload against this product through its Java client (clients/java), as RocketMQPeer runs it against
 * RocketMQ: one TransactionProducer shared by every sender thread, its check-backs on an executor of 4 threads set
 * with setExecutorService, the local transaction answering the planned outcome, check-back committing the unknown
 * ones. The checker runs apart (bench/peers/ours.py starts it) and there is no consumer to run here: a message is
 * consumable once the topic table's version holding it is committed, which bench/peers/ours.py reads.
 *
 * So the run has two halves. After sending, it writes each transaction's id and index (--ids) and prints
 * {"send_seconds", "t0_epoch_ms", "errors"}; it goes on answering check-backs until its standard input closes (the
 * deliveries are drained), then writes its CSV (checks included) and prints {"errors", "foreign_messages"}.
 *
 *   java -cp <client jars>:<classes> TxcoordPeer --config bench.toml --group G --topic T --ids ids.csv ...
 */
public final class TxcoordPeer implements Workload.Peer {
    private TransactionProducer producer;
    private String topic;
    private final Map<String, Integer> sent = new ConcurrentHashMap<>();

    private static LocalTransactionState stateOf(Workload.Outcome outcome) {
        return LocalTransactionState.valueOf(Workload.stateName(outcome));
    }

    @Override
    public void start(Workload workload) {
        topic = workload.topic;
        ExecutorService checkExecutor = Executors.newFixedThreadPool(4);
        producer = new TransactionProducer(workload.option("group"), new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message message, Object outcome) {
                return stateOf((Workload.Outcome) outcome);
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt message) {
                return stateOf(workload.checked(message.getBody()));
            }
        }, CoordinatorConfig.load(Path.of(workload.option("config"))));
        producer.setExecutorService(checkExecutor);  // shut down with the producer
        producer.start();
    }

    @Override
    public void transact(int thread, int index, byte[] body, Workload.Outcome outcome) {
        TransactionSendResult result = producer.sendMessageInTransaction(new Message(topic, body), outcome);
        if (result.getLocalTransactionState() != stateOf(outcome)) {
            throw new IllegalStateException("transaction " + index + " ended " + result.getLocalTransactionState());
        }
        sent.put(result.getTransactionId(), index);
    }

    void writeIds(Path path) throws IOException {
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(path))) {
            out.println("transaction_id,index");
            sent.forEach((id, index) -> out.println(id + "," + index));
        }
    }

    @Override
    public void close() {
        if (producer != null) {
            producer.shutdown();
        }
    }

    public static void main(String[] args) throws Exception {
        Workload workload = new Workload(args);
        try (TxcoordPeer peer = new TxcoordPeer()) {
            peer.start(workload);
            double sendSeconds = workload.send(peer);
            peer.writeIds(Path.of(workload.option("ids")));
            System.out.printf("{\"send_seconds\": %.3f, \"t0_epoch_ms\": %.3f, \"errors\": %d}%n", sendSeconds,
                    workload.t0EpochMs(), workload.errors());
            System.out.flush();
            while (System.in.read() >= 0) {
                // check-backs are answered meanwhile, on the producer's threads
            }
            workload.writeCsv(Path.of(workload.option("out")));
        }
        System.out.printf("{\"errors\": %d, \"foreign_messages\": %d}%n", workload.errors(), workload.foreign());
        System.exit(0);
    }
}
