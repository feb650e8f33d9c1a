// An order service sending its "order created" events transactionally, as the Python demo's does
// (coordinator/demo.py): each order is a row in the service's own database (here a directory of files, one per
// transaction) and a message to ORDER_TOPIC, delivered only if the order was stored.
//
// Run it from clients/java after `mvn -B package`:
//   java -cp "target/txcoord-client-0.1.0.jar:target/lib/*:target/examples-lib/*" examples/OrderService.java \
//       --config ../../conf/coordinator.toml --group order_group --orders 9 --db /tmp/orders
//
// Order i: i % 3 == 0 commits, i % 3 == 1 rolls back (its local transaction fails and says so), and i % 3 == 2
// stores the order but answers UNKNOW (as a service would that lost track of its database's answer), so the
// checker checks back and checkLocalTransaction answers COMMIT_MESSAGE from the database. It prints one JSON line
// per send and per check, and exits once every UNKNOW order was checked back (or --wait-s ran out).
import io.txcoord.client.CoordinatorConfig;
import io.txcoord.client.LocalTransactionState;
import io.txcoord.client.Message;
import io.txcoord.client.MessageExt;
import io.txcoord.client.TransactionListener;
import io.txcoord.client.TransactionProducer;
import io.txcoord.client.TransactionSendResult;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

public class OrderService {
    /** The service's database: one file per transaction, holding the order's state. */
    static final class Orders {
        private final Path dir;

        Orders(Path dir) throws IOException {
            this.dir = Files.createDirectories(dir);
        }

        void store(String transactionId, String order) {
            try {
                Files.writeString(dir.resolve(transactionId), order);
            } catch (IOException e) {
                throw new RuntimeException(e);
            }
        }

        boolean has(String transactionId) {
            return Files.exists(dir.resolve(transactionId));
        }
    }

    static final class OrderListener implements TransactionListener {
        private final Orders orders;
        final Set<String> checked = ConcurrentHashMap.newKeySet();

        OrderListener(Orders orders) {
            this.orders = orders;
        }

        @Override
        public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            int order = (Integer) arg;
            if (order % 3 == 1) {
                return LocalTransactionState.ROLLBACK_MESSAGE; // the order was refused: nothing stored
            }
            orders.store(msg.getTransactionId(), msg.getBodyAsString());
            return order % 3 == 0 ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.UNKNOW;
        }

        @Override
        public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            LocalTransactionState state = orders.has(msg.getTransactionId())
                    ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.ROLLBACK_MESSAGE;
            System.out.println("{\"event\":\"check\",\"transaction_id\":\"" + msg.getTransactionId() + "\",\"check_id\":\""
                    + msg.getCheckId() + "\",\"state\":\"" + state + "\"}");
            System.out.flush();
            checked.add(msg.getTransactionId());
            return state;
        }
    }

    public static void main(String[] args) throws Exception {
        Path config = Path.of("conf/coordinator.toml");
        String group = "order_group";
        String topic = "ORDER_TOPIC";
        int count = 9;
        Path db = Path.of("orders-db");
        long waitS = 120;
        for (int i = 0; i < args.length; i += 2) {
            switch (args[i]) {
                case "--config" -> config = Path.of(args[i + 1]);
                case "--group" -> group = args[i + 1];
                case "--topic" -> topic = args[i + 1];
                case "--orders" -> count = Integer.parseInt(args[i + 1]);
                case "--db" -> db = Path.of(args[i + 1]);
                case "--wait-s" -> waitS = Long.parseLong(args[i + 1]);
                default -> throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        OrderListener listener = new OrderListener(new Orders(db));
        Set<String> unknown = ConcurrentHashMap.newKeySet();
        try (TransactionProducer producer = new TransactionProducer(group, listener, CoordinatorConfig.load(config))) {
            producer.start();
            for (int order = 0; order < count; order++) {
                String body = "{\"order\":" + order + "}";
                Message msg = new Message(topic, "created", "order-" + order, body.getBytes(StandardCharsets.UTF_8));
                if (order % 3 == 2) {
                    msg.putUserProperty(Message.CHECK_IMMUNITY_TIME_IN_SECONDS, "1");
                }
                TransactionSendResult result = producer.sendMessageInTransaction(msg, order);
                System.out.println("{\"event\":\"sent\",\"order\":" + order + ",\"transaction_id\":\""
                        + result.getTransactionId() + "\",\"msg_id\":\"" + result.getMsgId() + "\",\"send_status\":\""
                        + result.getSendStatus() + "\",\"local_state\":\"" + result.getLocalTransactionState() + "\"}");
                System.out.flush();
                if (result.getLocalTransactionState() == LocalTransactionState.UNKNOW) {
                    unknown.add(result.getTransactionId());
                }
            }
            long deadline = System.currentTimeMillis() + waitS * 1000;
            while (!listener.checked.containsAll(unknown) && System.currentTimeMillis() < deadline) {
                Thread.sleep(100);
            }
            Thread.sleep(500); // the last answers' commits
        }
        boolean done = listener.checked.containsAll(unknown);
        System.out.println("{\"event\":\"done\",\"checked_all\":" + done + "}");
        System.exit(done ? 0 : 3);
    }
}
