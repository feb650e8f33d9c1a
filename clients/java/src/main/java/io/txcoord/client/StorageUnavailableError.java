package io.txcoord.client;

/** The storage failed a request on every attempt (throttling, server errors, timeouts, lost connections) until the retry bound ([storage] max_retries and retry_timeout) ran out. Retriable. */
public class StorageUnavailableError extends CoordinatorException {
    public StorageUnavailableError(String message, Throwable cause) {
        super(message, true, false, cause);
    }

    protected StorageUnavailableError(String message, boolean outcomeUnknown, Throwable cause) {
        super(message, true, outcomeUnknown, cause);
    }
}
