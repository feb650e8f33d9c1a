package io.txcoord.client;

/** A configuration file or TXCOORD_* variable holds a bad value. */
public class ConfigError extends CoordinatorException {
    public ConfigError(String message) {
        super(message, false, false, null);
    }

    public ConfigError(String message, Throwable cause) {
        super(message, false, false, cause);
    }
}
