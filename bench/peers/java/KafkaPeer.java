import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The workload against a Kafka broker in KRaft mode: one transactional producer per sender thread
 * (a Kafka producer runs one transaction at a time), each transaction begin → send → commit or
 * abort. Kafka has no check-back: a transaction whose outcome is unknown can only be aborted (by
 * the producer, or by the coordinator after transaction.timeout.ms), so unknown ones are aborted
 * here. A read_committed consumer assigned every partition sees what was committed.
 *
 *   java -cp <kafka jars>:<classes> KafkaPeer --bootstrap 127.0.0.1:9092 --topic T ...
 */
public final class KafkaPeer implements Workload.Peer {
    private final List<KafkaProducer<byte[], byte[]>> producers = new ArrayList<>();
    private Thread poller;
    private volatile boolean polling = true;
    private String topic;

    @Override
    public void start(Workload workload) throws Exception {
        String bootstrap = workload.option("bootstrap");
        topic = workload.topic;
        int partitions = Integer.parseInt(workload.option("partitions"));
        Properties adminProps = new Properties();
        adminProps.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        }

        Properties consumerProps = new Properties();
        consumerProps.put("bootstrap.servers", bootstrap);
        consumerProps.put("isolation.level", "read_committed");
        consumerProps.put("key.deserializer", ByteArrayDeserializer.class.getName());
        consumerProps.put("value.deserializer", ByteArrayDeserializer.class.getName());
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps);
        List<TopicPartition> assigned = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            assigned.add(new TopicPartition(topic, p));
        }
        consumer.assign(assigned);
        consumer.seekToBeginning(assigned);
        for (TopicPartition partition : assigned) {
            consumer.position(partition);  // resolve offsets now, not inside the timed run
        }
        poller = new Thread(() -> {
            try (consumer) {
                while (polling) {
                    for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(100))) {
                        workload.delivered(record.value());
                    }
                }
            }
        }, "consumer");
        poller.start();

        for (int t = 0; t < workload.threads; t++) {
            Properties producerProps = new Properties();
            producerProps.put("bootstrap.servers", bootstrap);
            producerProps.put("transactional.id", "bench-peers-" + topic + "-" + t);
            producerProps.put("acks", "all");
            producerProps.put("enable.idempotence", "true");
            producerProps.put("key.serializer", ByteArraySerializer.class.getName());
            producerProps.put("value.serializer", ByteArraySerializer.class.getName());
            KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps);
            producer.initTransactions();
            producers.add(producer);
        }
        workload.awaitConsumer(body -> {
            KafkaProducer<byte[], byte[]> producer = producers.get(0);
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, body));
            producer.commitTransaction();
        });
    }

    @Override
    public void transact(int thread, int index, byte[] body, Workload.Outcome outcome) throws Exception {
        KafkaProducer<byte[], byte[]> producer = producers.get(thread);
        producer.beginTransaction();
        producer.send(new ProducerRecord<>(topic, body));
        if (outcome == Workload.Outcome.COMMIT) {
            producer.commitTransaction();
        } else {
            producer.abortTransaction();
        }
    }

    @Override
    public void close() throws Exception {
        for (KafkaProducer<byte[], byte[]> producer : producers) {
            producer.close(Duration.ofSeconds(10));
        }
        polling = false;
        if (poller != null) {
            poller.join();
        }
    }

    public static void main(String[] args) throws Exception {
        Workload workload = new Workload(args);
        Workload.run(workload, new KafkaPeer(), false);
        System.exit(0);
    }
}
