package io.txcoord.client;

/** The storage refused this principal's request for a path (its grants do not cover it). Nothing was written. Not retriable. */
public class AccessDeniedError extends CoordinatorException {
    public AccessDeniedError(String message, Throwable cause) {
        super(message, false, false, cause);
    }
}
