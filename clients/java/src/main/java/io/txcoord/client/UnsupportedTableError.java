package io.txcoord.client;

/** A Delta table asks more of a writer than a blind append does (a writer feature, a constraint): nothing was written to it. Not retriable. */
public class UnsupportedTableError extends CoordinatorException {
    public UnsupportedTableError(String message) {
        super(message, false, false, null);
    }
}
