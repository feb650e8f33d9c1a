package io.txcoord.client;

/** The storage never said whether the half was stored (every attempt failed or lost its reply within the retry bound): the local transaction was not run. If the half was stored, the checker checks back once its immunity is over, and the listener answers for a local transaction that never ran (roll back). Retriable: a new send is a new transaction. */
public class HalfOutcomeUnknownError extends CoordinatorException {
    private final String transactionId;

    public HalfOutcomeUnknownError(String message, String transactionId, Throwable cause) {
        super(message, true, true, cause);
        this.transactionId = transactionId;
    }

    /** The transaction whose half may or may not be stored. */
    public String getTransactionId() {
        return transactionId;
    }
}
