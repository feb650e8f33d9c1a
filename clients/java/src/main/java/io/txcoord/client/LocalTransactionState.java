package io.txcoord.client;

/**
 * What became of a local transaction (RocketMQ's {@code LocalTransactionState}, spelled as on the wire:
 * {@code UNKNOW}, not {@code UNKNOWN}).
 */
public enum LocalTransactionState {
    /** Deliver the transaction's messages. */
    COMMIT_MESSAGE,
    /** Drop them. */
    ROLLBACK_MESSAGE,
    /** Decide nothing yet: the checker asks again later (a check-back). */
    UNKNOW;

    /** {@code value} as a state; {@code null} or anything else counts as {@link #UNKNOW}. */
    public static LocalTransactionState coerce(Object value) {
        if (value instanceof LocalTransactionState state) {
            return state;
        }
        if (value instanceof String text) {
            for (LocalTransactionState state : values()) {
                if (state.name().equals(text)) {
                    return state;
                }
            }
        }
        return UNKNOW;
    }
}
