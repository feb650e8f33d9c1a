package io.txcoord.client;

/**
 * What a producer group implements (RocketMQ's {@code TransactionListener}): run its local transaction once the
 * half message is durable, and answer check-backs about transactions whose outcome the checker lacks.
 *
 * <p>Both are called from the producer's threads: {@code executeLocalTransaction} on the sending thread,
 * {@code checkLocalTransaction} on the check-back pool (several at once). An exception or {@code null} counts
 * as {@link LocalTransactionState#UNKNOW}.
 *
 * <pre>{@code
 * class OrderListener implements TransactionListener {
 *     public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
 *         db.insertOrder((Order) arg, msg.getTransactionId());
 *         return LocalTransactionState.COMMIT_MESSAGE;
 *     }
 *     public LocalTransactionState checkLocalTransaction(MessageExt msg) {
 *         return db.hasOrderOf(msg.getTransactionId()) ? COMMIT_MESSAGE : ROLLBACK_MESSAGE;
 *     }
 * }
 * }</pre>
 */
public interface TransactionListener {
    /**
     * Runs the local transaction of {@code msg} (for a send of several messages, their first; see
     * {@link #executeLocalTransaction(java.util.List, Object)}) with the caller's {@code arg}.
     */
    LocalTransactionState executeLocalTransaction(Message msg, Object arg);

    /**
     * The local transaction of a send of several messages in one transaction: by default, the one-message
     * method with the first message.
     */
    default LocalTransactionState executeLocalTransaction(java.util.List<Message> msgs, Object arg) {
        return executeLocalTransaction(msgs.get(0), arg);
    }

    /**
     * Says what became of the local transaction of {@code msg} (a check-back): {@code msg} is the transaction's
     * first message, with its transaction id. Answer from the same records the local transaction wrote.
     */
    LocalTransactionState checkLocalTransaction(MessageExt msg);
}
