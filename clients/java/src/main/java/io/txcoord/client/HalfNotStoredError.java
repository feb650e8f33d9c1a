package io.txcoord.client;

/** The half message could not be made durable: the local transaction was not run and the send counts as ROLLBACK_MESSAGE. Retriable when the storage failed past the retry bound, not when it refused or the log is not a table a blind append honours. */
public class HalfNotStoredError extends CoordinatorException {
    public HalfNotStoredError(String message, boolean retriable, Throwable cause) {
        super(message, retriable, false, cause);
    }
}
