package io.txcoord.client;

/** A conditional write (a Delta commit) whose outcome the storage never told: it may have been made. Retriable, but read the file before writing again. */
public class WriteOutcomeUnknownError extends StorageUnavailableError {
    public WriteOutcomeUnknownError(String message, Throwable cause) {
        super(message, true, cause);
    }
}
