package io.txcoord.client;

import java.time.Instant;

/**
 * The message a check-back hands to {@link TransactionListener#checkLocalTransaction} (RocketMQ's
 * {@code MessageExt}): the transaction's first message as stored, with its ids, when it was born, and which
 * check of the transaction this is.
 */
public class MessageExt extends Message {
    private Instant bornTimestamp;
    private int checkTimes;
    private String checkId;
    private long queueOffset = -1;

    public MessageExt() {
    }

    public MessageExt(String topic, byte[] body) {
        super(topic, body);
    }

    /** The producer's clock when the send began (informational). */
    public Instant getBornTimestamp() {
        return bornTimestamp;
    }

    public void setBornTimestamp(Instant bornTimestamp) {
        this.bornTimestamp = bornTimestamp;
    }

    /** This check is the transaction's n-th (from 1). */
    public int getCheckTimes() {
        return checkTimes;
    }

    public void setCheckTimes(int checkTimes) {
        this.checkTimes = checkTimes;
    }

    /** The id of the check being answered ({@code <transaction_id>-<n>}). */
    public String getCheckId() {
        return checkId;
    }

    public void setCheckId(String checkId) {
        this.checkId = checkId;
    }

    /** The queue offset the checker gave the transaction's first message. */
    public long getQueueOffset() {
        return queueOffset;
    }

    public void setQueueOffset(long queueOffset) {
        this.queueOffset = queueOffset;
    }
}
