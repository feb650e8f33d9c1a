package io.txcoord.client;

import io.txcoord.client.internal.CheckBackWorker;
import io.txcoord.client.internal.CommitLogWriter;
import io.txcoord.client.internal.DeltaLog;
import io.txcoord.client.internal.Instances;
import io.txcoord.client.internal.ObjectStore;
import io.txcoord.client.internal.Records;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.nio.file.FileSystems;
import java.nio.file.PathMatcher;
import java.nio.file.Paths;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.regex.Pattern;

/**
 * Sends messages in transactions for one producer group, and answers check-backs: RocketMQ's
 * {@code TransactionMQProducer} over txcoord's lakehouse (docs/protocol.md). Safe to share between threads:
 * concurrent sends share commits (group commit).
 *
 * <pre>{@code
 * try (TransactionProducer producer = new TransactionProducer("order_group", new OrderListener(),
 *         CoordinatorConfig.load(Path.of("conf/coordinator.toml")))) {
 *     producer.start();
 *     TransactionSendResult result = producer.sendMessageInTransaction(
 *             new Message("ORDER_TOPIC", "{\"order\":42}".getBytes(UTF_8)), order);
 *     result.getLocalTransactionState(); // COMMIT_MESSAGE
 * }
 * }</pre>
 */
public class TransactionProducer implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(TransactionProducer.class);
    public static final Pattern NAME = Pattern.compile("[A-Za-z0-9_-]+");
    public static final int NAME_MAX_LENGTH = 127;
    public static final int MAX_BODY_BYTES = 4 * 1024 * 1024;
    public static final long MAX_TRANSACTION_BODY_BYTES = 64L * 1024 * 1024;
    public static final int MAX_IMMUNITY_SECONDS = 7 * 24 * 3600;
    private static final Pattern IMMUNITY = Pattern.compile("[0-9]{1,9}");
    private static final Set<String> DELAY_PROPERTIES = Set.of("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC",
            "TIMER_DELAY_MS");

    private enum State { CREATED, RUNNING, STOPPED }

    private final String group;
    private final TransactionListener listener;
    private final CoordinatorConfig config;
    private final String instanceId = Records.randomHex(16);
    private final Object lock = new Object();
    private State state = State.CREATED;
    private ObjectStore store;
    private Instances instances;
    private CommitLogWriter writer;
    private CheckBackWorker checkback;
    private ExecutorService checkExecutor;
    private int logNumber = -1;

    public TransactionProducer(String group, TransactionListener listener, CoordinatorConfig config) {
        this.group = validateName("producer group", group);
        if (listener == null) {
            throw new IllegalArgumentException("a TransactionProducer needs a TransactionListener");
        }
        this.listener = listener;
        this.config = config;
    }

    static String validateName(String what, String name) {
        if (name == null || name.isBlank()) {
            throw new MessageValidationError(what + " is missing");
        }
        if (name.length() > NAME_MAX_LENGTH) {
            throw new MessageValidationError(what + " is " + name.length() + " characters long; the maximum is "
                    + NAME_MAX_LENGTH);
        }
        if (!NAME.matcher(name).matches()) {
            throw new MessageValidationError(what + " " + name + " does not match ^[A-Za-z0-9_-]+$");
        }
        return name;
    }

    public String getProducerGroup() {
        return group;
    }

    /** This instance of the group, as the checker addresses it (a new one for each producer object). */
    public String getInstanceId() {
        return instanceId;
    }

    /** The number of the commit log this instance claimed (0 for {@code commit_log}), or -1 before start. */
    public int getCommitLogNumber() {
        return logNumber;
    }

    public TransactionListener getTransactionListener() {
        return listener;
    }

    /**
     * The executor that runs the listener's {@code checkLocalTransaction} calls, as RocketMQ's
     * {@code TransactionMQProducer.setExecutorService}: set before {@link #start()}; without one, a pool of 4 daemon
     * threads. {@link #shutdown()} shuts it down and waits up to 30 s for the checks in progress, as RocketMQ's does.
     * Throws {@link ProducerStateError} once started.
     */
    public void setExecutorService(ExecutorService executorService) {
        synchronized (lock) {
            if (state != State.CREATED) {
                throw new ProducerStateError("producer " + group + " is started or shut down: its check-back executor is "
                        + "set before start()");
            }
            this.checkExecutor = executorService;
        }
    }

    /** The executor set by {@link #setExecutorService}, or {@code null} (the producer's own pool). */
    public ExecutorService getExecutorService() {
        return checkExecutor;
    }

    /**
     * Writes the instance record, claims a commit log (creating it and the group's logs below it if missing) and
     * starts answering check-backs. Idempotent; throws {@link ProducerStateError} after {@link #shutdown()}.
     */
    public TransactionProducer start() {
        synchronized (lock) {
            if (state == State.RUNNING) {
                return this;
            }
            if (state == State.STOPPED) {
                throw new ProducerStateError("producer " + group + " was shut down; create a new one");
            }
            ObjectStore opened = ObjectStore.open(config);
            Instances registry = new Instances(opened, group, instanceId, config.getProducerHeartbeatMs() / 1000.0);
            int claimed = -1;
            try {
                registry.announce();
                int number = registry.claimLog();
                claimed = number;
                CommitLogWriter logWriter;
                try {
                    logWriter = openLog(opened, number);
                } catch (AccessDeniedError e) {
                    if (number == 0) {
                        throw e;
                    }
                    LOG.warn("this instance shares group " + group + "'s first commit log: " + e.getMessage());
                    registry.releaseLog(number);
                    number = 0;
                    claimed = -1;
                    logWriter = openLog(opened, 0);
                }
                CheckBackWorker worker = new CheckBackWorker(opened, group, instanceId, listener, logWriter, registry,
                        config.getProducerHeartbeatMs(), config.getTransactionCheckIntervalMs(), checkExecutor);
                worker.start();
                this.store = opened;
                this.instances = registry;
                this.writer = logWriter;
                this.checkback = worker;
                this.logNumber = number;
                this.state = State.RUNNING;
            } catch (RuntimeException e) {
                // A start that failed leaves no live record and no claim behind (the storage may refuse these too).
                try {
                    if (claimed >= 0) {
                        registry.releaseLog(claimed);
                    }
                    registry.withdraw();
                } catch (RuntimeException cleanup) {
                    e.addSuppressed(cleanup);
                } finally {
                    opened.close();
                }
                throw e;
            }
        }
        LOG.info("producer started group=" + group + " instance=" + instanceId + " commit_log=" + Instances.logKey(group, logNumber));
        return this;
    }

    private CommitLogWriter openLog(ObjectStore opened, int number) {
        for (int below = 0; below <= number; below++) {
            new DeltaLog(opened, Instances.logKey(group, below)).createIfMissing(Records.SCHEMA_STRING, Records.CONFIGURATION);
        }
        return new CommitLogWriter(opened, new DeltaLog(opened, Instances.logKey(group, number)),
                config.getCommitIntervalMs(), opened.isLocal() ? null : "groups/" + group + ".bell");
    }

    /**
     * Stops answering check-backs and deletes the instance record, writes every record already submitted, then
     * releases the commit log's claim. Idempotent.
     */
    public void shutdown() {
        synchronized (lock) {
            if (state != State.RUNNING) {
                state = State.STOPPED;
                return;
            }
            state = State.STOPPED;
        }
        try {
            checkback.stop();
        } catch (RuntimeException e) {
            LOG.warn("withdrawing instance " + instanceId + ": " + e.getMessage());
        } finally {
            try {
                writer.close();
            } finally {
                try {
                    instances.releaseLog(logNumber);
                } finally {
                    store.close();
                }
            }
        }
        LOG.info("producer shut down group=" + group);
    }

    /** {@link #shutdown()}. */
    @Override
    public void close() {
        shutdown();
    }

    /**
     * Sends {@code msg} as a half message, runs the listener's local transaction once it is durable, then sends
     * its outcome one-way. Throws {@link MessageValidationError} (nothing written), {@link HalfNotStoredError}
     * (nothing stored; the local transaction not run) or {@link HalfOutcomeUnknownError} (the storage never said;
     * the local transaction not run).
     */
    public TransactionSendResult sendMessageInTransaction(Message msg, Object arg) {
        if (msg == null) {
            throw new MessageValidationError("a transaction needs a message");
        }
        return send(List.of(msg), true, arg);
    }

    /**
     * Sends several messages, possibly to several topics, in one transaction: all are delivered or none. The
     * listener's {@link TransactionListener#executeLocalTransaction(List, Object)} receives them all.
     */
    public TransactionSendResult sendMessagesInTransaction(List<Message> msgs, Object arg) {
        if (msgs == null) {
            throw new MessageValidationError("a transaction needs at least one message");
        }
        return send(new ArrayList<>(msgs), false, arg);
    }

    private CommitLogWriter runningWriter() {
        synchronized (lock) {
            if (state == State.CREATED) {
                throw new ProducerStateError("producer " + group + " is not started; call start() first");
            }
            if (state == State.STOPPED) {
                throw new ProducerStateError("producer " + group + " was shut down");
            }
            return writer;
        }
    }

    private TransactionSendResult send(List<Message> msgs, boolean single, Object arg) {
        CommitLogWriter logWriter = runningWriter();
        List<Map<String, String>> properties = validate(msgs);
        String transactionId = Records.timeOrderedId();
        Instant born = Instant.now();
        List<Records.Record> halves = new ArrayList<>(msgs.size());
        List<String> msgIds = new ArrayList<>(msgs.size());
        for (int i = 0; i < msgs.size(); i++) {
            Message m = msgs.get(i);
            String msgId = Records.randomHex(16);
            m.setTransactionId(transactionId);
            m.setMsgId(msgId);
            msgIds.add(msgId);
            halves.add(Records.half(group, transactionId, msgId, i, msgs.size(), m.getTopic(), m.getKeys(), m.getTags(),
                    properties.get(i), m.getBody(), born));
        }
        try {
            logWriter.submit(halves).get();
        } catch (ProducerStateError e) {
            throw e;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new HalfOutcomeUnknownError("transaction " + transactionId + ": interrupted while the half was being "
                    + "stored; the local transaction was not run", transactionId, e);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof CoordinatorException ce && ce.outcomeUnknown()) {
                throw new HalfOutcomeUnknownError("transaction " + transactionId + ": the storage never confirmed whether "
                        + "the half message(s) were stored; the local transaction was not run. If they were, the checker "
                        + "checks back once their immunity is over", transactionId, cause);
            }
            boolean retriable = cause instanceof CoordinatorException ce && ce.retriable();
            throw new HalfNotStoredError("transaction " + transactionId + ": the half message(s) could not be stored ("
                    + cause.getMessage() + "); the local transaction was not run (state ROLLBACK_MESSAGE)", retriable, cause);
        }
        LocalTransactionState local;
        try {
            Object returned = single ? listener.executeLocalTransaction(msgs.get(0), arg)
                    : listener.executeLocalTransaction(Collections.unmodifiableList(msgs), arg);
            local = LocalTransactionState.coerce(returned);
        } catch (RuntimeException e) {
            LOG.warn("local transaction failed transaction_id=" + transactionId + "; state UNKNOW", e);
            local = LocalTransactionState.UNKNOW;
        }
        try {
            logWriter.submit(List.of(Records.end(group, transactionId, local.name(), null))).whenComplete((v, e) -> {
                if (e != null) {
                    LOG.warn("end record not stored transaction_id=" + transactionId + ": " + e
                            + "; check-back will resolve it");
                }
            });
        } catch (ProducerStateError e) {
            LOG.warn("end not sent, producer shutting down transaction_id=" + transactionId
                    + "; check-back will resolve it");
        }
        return new TransactionSendResult(SendStatus.SEND_OK, transactionId, msgIds, local);
    }

    /** The rules of docs/protocol.md#names-and-limits; each message's properties to send (delay ones removed). */
    private List<Map<String, String>> validate(List<Message> msgs) {
        if (msgs.isEmpty()) {
            throw new MessageValidationError("a transaction needs at least one message");
        }
        Set<Message> seen = Collections.newSetFromMap(new IdentityHashMap<>());
        long total = 0;
        List<Map<String, String>> result = new ArrayList<>(msgs.size());
        for (Message m : msgs) {
            if (m == null) {
                throw new MessageValidationError("a transaction's message is null");
            }
            if (!seen.add(m)) {
                throw new MessageValidationError("the same Message object appears twice; each message gets its own id");
            }
            validateName("topic", m.getTopic());
            byte[] body = m.getBody();
            int size = body == null ? 0 : body.length;
            if (size == 0) {
                throw new MessageValidationError("body is empty");
            }
            if (size > MAX_BODY_BYTES) {
                throw new MessageValidationError("body is " + size + " bytes; the maximum is " + MAX_BODY_BYTES);
            }
            total += size;
            Map<String, String> properties = new LinkedHashMap<>();
            for (Map.Entry<String, String> e : m.getProperties().entrySet()) {
                if (e.getKey() == null || e.getValue() == null) {
                    throw new MessageValidationError("property " + e.getKey() + " must map a string to a string, got "
                            + e.getValue());
                }
                if (!DELAY_PROPERTIES.contains(e.getKey())) {
                    properties.put(e.getKey(), e.getValue());
                }
            }
            String immunity = properties.get(Message.CHECK_IMMUNITY_TIME_IN_SECONDS);
            if (immunity != null && (!IMMUNITY.matcher(immunity).matches() || Integer.parseInt(immunity) < 1
                    || Integer.parseInt(immunity) > MAX_IMMUNITY_SECONDS)) {
                throw new MessageValidationError(Message.CHECK_IMMUNITY_TIME_IN_SECONDS + " must be a whole number of "
                        + "seconds in 1.." + MAX_IMMUNITY_SECONDS + ", got " + immunity);
            }
            refuseUngranted(m.getTopic());
            result.add(properties);
        }
        if (total > MAX_TRANSACTION_BODY_BYTES) {
            throw new MessageValidationError("the transaction's bodies are " + total + " bytes together; the maximum is "
                    + MAX_TRANSACTION_BODY_BYTES);
        }
        return result;
    }

    private void refuseUngranted(String topic) {
        Map<String, List<String>> grants = config.getTopicGrants();
        if (grants == null) {
            return;
        }
        List<String> patterns = grants.getOrDefault(group, List.of());
        for (String pattern : patterns) {
            PathMatcher matcher = FileSystems.getDefault().getPathMatcher("glob:" + pattern.replace("/", "\\/"));
            if (pattern.equals(topic) || matcher.matches(Paths.get(topic))) {
                return;
            }
        }
        throw new MessageValidationError("producer group '" + group + "' may not publish to topic '" + topic
                + "' (topic_grants: " + (patterns.isEmpty() ? "no topic" : String.join(", ", patterns))
                + "): nothing was sent, the local transaction was not run");
    }
}
