package io.txcoord.client;

import java.util.List;

/**
 * What {@link TransactionProducer#sendMessageInTransaction} returns (RocketMQ's {@code TransactionSendResult}):
 * the send status, the transaction id, the message id (the first message's; every one in {@link #getMsgIds()})
 * and the local transaction's state.
 */
public final class TransactionSendResult {
    private final SendStatus sendStatus;
    private final String transactionId;
    private final List<String> msgIds;
    private final LocalTransactionState localTransactionState;

    public TransactionSendResult(SendStatus sendStatus, String transactionId, List<String> msgIds,
                                 LocalTransactionState localTransactionState) {
        this.sendStatus = sendStatus;
        this.transactionId = transactionId;
        this.msgIds = List.copyOf(msgIds);
        this.localTransactionState = localTransactionState;
    }

    public SendStatus getSendStatus() {
        return sendStatus;
    }

    public String getTransactionId() {
        return transactionId;
    }

    /** The first message's id. */
    public String getMsgId() {
        return msgIds.get(0);
    }

    /** Every message's id, in the order sent. */
    public List<String> getMsgIds() {
        return msgIds;
    }

    public LocalTransactionState getLocalTransactionState() {
        return localTransactionState;
    }

    @Override
    public String toString() {
        return "TransactionSendResult{sendStatus=" + sendStatus + ", transactionId=" + transactionId + ", msgIds="
                + msgIds + ", localTransactionState=" + localTransactionState + "}";
    }
}
