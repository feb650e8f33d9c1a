package io.txcoord.client;

/** The producer was used before start() or after shutdown(): a caller's bug. */
public class ProducerStateError extends CoordinatorException {
    public ProducerStateError(String message) {
        super(message, false, false, null);
    }
}
