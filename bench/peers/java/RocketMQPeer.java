import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The workload against a RocketMQ 5.x name server and broker: one TransactionMQProducer shared by
 * every sender thread (it is thread-safe), sendMessageInTransaction per transaction, the local
 * transaction answering the planned outcome, check-back committing the unknown ones; a push
 * consumer on the topic sees what was committed.
 *
 *   java -cp <rocketmq jars>:<classes> RocketMQPeer --namesrv 127.0.0.1:9876 --topic T ...
 */
public final class RocketMQPeer implements Workload.Peer {
    private TransactionMQProducer producer;
    private DefaultMQPushConsumer consumer;
    private ExecutorService checkExecutor;
    private String topic;

    private static LocalTransactionState stateOf(Workload.Outcome outcome) {
        return LocalTransactionState.valueOf(Workload.stateName(outcome));
    }

    @Override
    public void start(Workload workload) throws Exception {
        String namesrv = workload.option("namesrv");
        topic = workload.topic;
        consumer = new DefaultMQPushConsumer("bench-peers-consumer-" + topic);
        consumer.setNamesrvAddr(namesrv);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(workload.topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            for (MessageExt message : messages) {
                workload.delivered(message.getBody());
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();

        checkExecutor = Executors.newFixedThreadPool(4);
        producer = new TransactionMQProducer("bench-peers-producer-" + topic);
        producer.setNamesrvAddr(namesrv);
        producer.setExecutorService(checkExecutor);
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message message, Object outcome) {
                return stateOf((Workload.Outcome) outcome);
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt message) {
                return stateOf(workload.checked(message.getBody()));
            }
        });
        producer.start();
        workload.awaitConsumer(body -> producer.send(new Message(topic, body)));
    }

    @Override
    public void transact(int thread, int index, byte[] body, Workload.Outcome outcome) throws Exception {
        TransactionSendResult result = producer.sendMessageInTransaction(new Message(topic, body), outcome);
        if (result.getLocalTransactionState() != stateOf(outcome)) {
            throw new IllegalStateException("transaction " + index + " ended " + result.getLocalTransactionState());
        }
    }

    @Override
    public void close() throws Exception {
        if (producer != null) {
            producer.shutdown();
        }
        if (consumer != null) {
            consumer.shutdown();
        }
        if (checkExecutor != null) {
            checkExecutor.shutdown();
            checkExecutor.awaitTermination(10, TimeUnit.SECONDS);
        }
    }

    public static void main(String[] args) throws Exception {
        Workload workload = new Workload(args);
        Workload.run(workload, new RocketMQPeer(), true);
        System.exit(0);
    }
}
