package io.txcoord.client;

/**
 * Base class of every error the client raises (Python's {@code CoordinatorError}). Each says what its caller may
 * do (docs/producer.md#errors): {@link #retriable()}, the same call made again as it was may succeed;
 * {@link #outcomeUnknown()}, what the call was to write may or may not have been written, so assume neither.
 *
 * <pre>{@code
 * try {
 *     producer.sendMessageInTransaction(msg, order);
 * } catch (CoordinatorException e) {
 *     if (e.outcomeUnknown()) { ... }  // look the transaction up before saying either way
 *     else if (e.retriable()) { ... }  // send again, later
 * }
 * }</pre>
 */
public class CoordinatorException extends RuntimeException {
    private final boolean retriable;
    private final boolean outcomeUnknown;

    public CoordinatorException(String message, boolean retriable, boolean outcomeUnknown, Throwable cause) {
        super(message, cause);
        this.retriable = retriable;
        this.outcomeUnknown = outcomeUnknown;
    }

    public CoordinatorException(String message) {
        this(message, false, false, null);
    }

    /** Whether the same call, made again as it was, may succeed. */
    public boolean retriable() {
        return retriable;
    }

    /** Whether what the call was to write may or may not have been written. */
    public boolean outcomeUnknown() {
        return outcomeUnknown;
    }

    /** The error's class name as the Python client spells it (the conformance kit's vocabulary). */
    public String errorName() {
        return getClass().getSimpleName();
    }
}
