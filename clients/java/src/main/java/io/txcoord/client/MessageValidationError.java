package io.txcoord.client;

/** A message was refused at the producer (a name, body, property or grant rule of docs/protocol.md#names-and-limits): nothing was written, the local transaction was not run. Not retriable. */
public class MessageValidationError extends CoordinatorException {
    public MessageValidationError(String message) {
        super(message, false, false, null);
    }
}
