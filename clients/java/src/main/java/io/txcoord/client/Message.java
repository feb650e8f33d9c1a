package io.txcoord.client;

import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Objects;

/**
 * A message to send in a transaction (RocketMQ's {@code Message}): a topic, a body, and optional keys, tags and
 * user properties. The transaction id and the message id are filled in when it is sent.
 *
 * <pre>{@code
 * Message msg = new Message("ORDER_TOPIC", "created", "order-42", "{\"order\":42}".getBytes(UTF_8));
 * msg.putUserProperty("CHECK_IMMUNITY_TIME_IN_SECONDS", "10");
 * }</pre>
 */
public class Message {
    /** The per-message immunity property: no check-back before this many seconds after the half is stored. */
    public static final String CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS";

    private String topic;
    private byte[] body;
    private String keys;
    private String tags;
    private final Map<String, String> properties = new LinkedHashMap<>();
    private String transactionId;
    private String msgId;

    public Message() {
    }

    public Message(String topic, byte[] body) {
        this.topic = topic;
        this.body = body;
    }

    /** RocketMQ's {@code Message(topic, tags, body)}. */
    public Message(String topic, String tags, byte[] body) {
        this(topic, body);
        this.tags = tags;
    }

    /** RocketMQ's {@code Message(topic, tags, keys, body)}. */
    public Message(String topic, String tags, String keys, byte[] body) {
        this(topic, tags, body);
        this.keys = keys;
    }

    public String getTopic() {
        return topic;
    }

    public void setTopic(String topic) {
        this.topic = topic;
    }

    public byte[] getBody() {
        return body;
    }

    public void setBody(byte[] body) {
        this.body = body;
    }

    /** The body decoded as UTF-8 (a convenience). */
    public String getBodyAsString() {
        return body == null ? null : new String(body, StandardCharsets.UTF_8);
    }

    public String getKeys() {
        return keys;
    }

    public void setKeys(String keys) {
        this.keys = keys;
    }

    /** RocketMQ's keys setter for several keys: joined by a space, as RocketMQ joins them. */
    public void setKeys(Collection<String> keys) {
        this.keys = keys == null ? null : String.join(" ", keys);
    }

    public String getTags() {
        return tags;
    }

    public void setTags(String tags) {
        this.tags = tags;
    }

    /** The user properties (a live, ordered map). */
    public Map<String, String> getProperties() {
        return properties;
    }

    public void setProperties(Map<String, String> properties) {
        this.properties.clear();
        if (properties != null) {
            this.properties.putAll(properties);
        }
    }

    public void putUserProperty(String name, String value) {
        properties.put(Objects.requireNonNull(name, "name"), Objects.requireNonNull(value, "value"));
    }

    public String getUserProperty(String name) {
        return properties.get(name);
    }

    /** Alias of {@link #getUserProperty}. */
    public String getProperty(String name) {
        return properties.get(name);
    }

    /** The transaction's id, set when the message is sent (and on a message handed to a check-back). */
    public String getTransactionId() {
        return transactionId;
    }

    public void setTransactionId(String transactionId) {
        this.transactionId = transactionId;
    }

    /** The message's id, set when it is sent. */
    public String getMsgId() {
        return msgId;
    }

    public void setMsgId(String msgId) {
        this.msgId = msgId;
    }

    @Override
    public String toString() {
        return "Message{topic=" + topic + ", keys=" + keys + ", tags=" + tags + ", properties=" + properties
                + ", body=" + (body == null ? "null" : body.length + " bytes") + ", transactionId=" + transactionId
                + ", msgId=" + msgId + "}";
    }
}
