package io.txcoord.client.conformance;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.txcoord.client.CoordinatorConfig;
import io.txcoord.client.CoordinatorException;
import io.txcoord.client.HalfOutcomeUnknownError;
import io.txcoord.client.LocalTransactionState;
import io.txcoord.client.Message;
import io.txcoord.client.MessageExt;
import io.txcoord.client.ProducerStateError;
import io.txcoord.client.TransactionListener;
import io.txcoord.client.TransactionProducer;
import io.txcoord.client.TransactionSendResult;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;

/**
 * The Java client under the conformance kit's line protocol (docs/protocol.md#the-line-protocol): ops as JSON
 * lines on stdin, replies and events as JSON lines on stdout, logs on stderr. One producer instance per process.
 *
 * <pre>
 * txcoord conformance --producer "java -cp 'clients/java/target/txcoord-client-0.1.0.jar:clients/java/target/lib/*:clients/java/target/examples-lib/*' \
 *     io.txcoord.client.conformance.ConformanceDriver"
 * </pre>
 */
public final class ConformanceDriver {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String HANG = "HANG";

    private final PrintStream out;
    private final Map<String, String> answers = new ConcurrentHashMap<>();
    private TransactionProducer producer;
    private boolean stopped;

    ConformanceDriver(PrintStream out) {
        this.out = out;
    }

    /** Writes one JSON line, whole, whichever thread calls. */
    void emit(JsonNode line) {
        synchronized (out) {
            out.print(line.toString() + "\n");
            out.flush();
        }
    }

    /** The listener: scripted local transactions, checks answered with the state last set for the transaction. */
    final class ScriptedListener implements TransactionListener {
        @Override
        public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            JsonNode op = (JsonNode) arg;
            String checkState = op.path("check_state").isTextual() ? op.get("check_state").asText() : "UNKNOW";
            answers.put(msg.getTransactionId(), checkState);
            String local = op.path("local_state").asText();
            if (HANG.equals(local)) {
                ObjectNode event = JSON.createObjectNode();
                event.put("event", "executing");
                event.set("request", op.get("request"));
                event.put("transaction_id", msg.getTransactionId());
                emit(event);
                try {
                    new CountDownLatch(1).await(); // a crash after the half: the kit kills the process
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            long delay = op.path("delay_ms").asLong(0);
            if (delay > 0) {
                try {
                    Thread.sleep(delay);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            return LocalTransactionState.valueOf(local);
        }

        @Override
        public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            ObjectNode event = JSON.createObjectNode();
            event.put("event", "check");
            event.put("transaction_id", msg.getTransactionId());
            event.put("msg_id", msg.getMsgId());
            event.put("topic", msg.getTopic());
            emit(event);
            return LocalTransactionState.valueOf(answers.getOrDefault(msg.getTransactionId(), "UNKNOW"));
        }
    }

    private final ScriptedListener listener = new ScriptedListener();

    /** Takes one op and returns its reply. */
    ObjectNode handle(JsonNode op) {
        String name = op.path("op").isTextual() ? op.get("op").asText() : null;
        ObjectNode reply = JSON.createObjectNode();
        reply.put("reply", name);
        if ("send".equals(name)) {
            reply.set("request", op.get("request"));
        }
        try {
            switch (name == null ? "" : name) {
                case "start" -> start(op, reply);
                case "send" -> send(op, reply);
                case "answer" -> {
                    answers.put(op.get("transaction_id").asText(),
                            LocalTransactionState.valueOf(op.get("state").asText()).name());
                    reply.put("ok", true);
                }
                case "stop" -> {
                    if (producer != null) {
                        producer.shutdown();
                    }
                    stopped = true;
                    reply.put("ok", true);
                }
                default -> {
                    reply.put("ok", false);
                    reply.put("error", "UnknownOp");
                    reply.put("message", "unknown op " + name);
                }
            }
        } catch (RuntimeException e) {
            e.printStackTrace(System.err);
            ObjectNode failed = JSON.createObjectNode();
            failed.put("reply", name);
            if ("send".equals(name)) {
                failed.set("request", op.get("request"));
            }
            failed.put("ok", false);
            failed.put("error", e instanceof CoordinatorException ce ? ce.errorName() : e.getClass().getSimpleName());
            failed.put("retriable", e instanceof CoordinatorException ce && ce.retriable());
            failed.put("outcome_unknown", e instanceof CoordinatorException ce && ce.outcomeUnknown());
            if (e instanceof HalfOutcomeUnknownError unknown) {
                failed.put("transaction_id", unknown.getTransactionId());
            }
            failed.put("message", String.valueOf(e.getMessage()));
            return failed;
        }
        return reply;
    }

    private void start(JsonNode op, ObjectNode reply) {
        CoordinatorConfig config = CoordinatorConfig.load(Path.of(op.get("config").asText()));
        producer = new TransactionProducer(op.get("group").asText(), listener, config).start();
        reply.put("ok", true);
        reply.put("instance_id", producer.getInstanceId());
    }

    private void send(JsonNode op, ObjectNode reply) {
        if (producer == null) {
            throw new ProducerStateError("send before start");
        }
        List<Message> messages = new ArrayList<>();
        for (JsonNode m : op.path("messages")) {
            Message message = new Message(m.path("topic").isTextual() ? m.get("topic").asText() : null,
                    Base64.getDecoder().decode(m.path("body").asText("")));
            if (m.path("keys").isTextual()) {
                message.setKeys(m.get("keys").asText());
            }
            if (m.path("tags").isTextual()) {
                message.setTags(m.get("tags").asText());
            }
            m.path("properties").fields().forEachRemaining(e -> message.getProperties().put(e.getKey(),
                    e.getValue().isNull() ? null : e.getValue().asText()));
            messages.add(message);
        }
        TransactionSendResult result = messages.size() == 1 ? producer.sendMessageInTransaction(messages.get(0), op)
                : producer.sendMessagesInTransaction(messages, op);
        reply.put("ok", true);
        reply.put("send_status", result.getSendStatus().name());
        reply.put("transaction_id", result.getTransactionId());
        reply.putArray("msg_ids").addAll(result.getMsgIds().stream().map(JSON.getNodeFactory()::textNode).toList());
        reply.put("local_state", result.getLocalTransactionState().name());
    }

    /** Serves ops from stdin until {@code stop} (exit 0) or the end of the input (the producer is shut down). */
    public static void main(String[] args) throws Exception {
        PrintStream stdout = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
                StandardCharsets.UTF_8);
        System.setOut(System.err); // whatever a library prints goes to stderr, never between the replies
        ConformanceDriver driver = new ConformanceDriver(stdout);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            JsonNode op;
            try {
                op = JSON.readTree(line);
            } catch (Exception e) {
                op = null;
            }
            if (op == null || !op.isObject()) {
                ObjectNode bad = JSON.createObjectNode();
                bad.putNull("reply");
                bad.put("ok", false);
                bad.put("error", "BadRequest");
                bad.put("message", "not a JSON object");
                driver.emit(bad);
                continue;
            }
            driver.emit(driver.handle(op));
            if (driver.stopped) {
                System.exit(0);
            }
        }
        driver.handle(JSON.createObjectNode().put("op", "stop"));
        System.exit(0);
    }
}
