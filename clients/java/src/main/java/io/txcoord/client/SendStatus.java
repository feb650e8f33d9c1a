package io.txcoord.client;

/** Whether the half message was stored (RocketMQ's {@code SendStatus}); a send that did not store it throws. */
public enum SendStatus {
    SEND_OK
}
