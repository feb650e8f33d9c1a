package io.txcoord.client.internal;

import io.txcoord.client.CoordinatorConfig;

import java.util.List;

/**
 * The few storage operations the client protocol needs (docs/protocol.md#making-a-commit), on a local disk
 * ({@link LocalStore}) or S3 ({@link S3Store}). Keys are relative to the lakehouse root, '/'-separated.
 */
public interface ObjectStore extends AutoCloseable {
    /** A file's content with its version tag (ETag; on a local disk, a digest of the content) and its time. */
    record Versioned(byte[] data, String etag, long modifiedMs) {
    }

    static ObjectStore open(CoordinatorConfig config) {
        return config.isObjectStore() ? new S3Store(config) : new LocalStore(config.getLakehouse());
    }

    /** The file's content, or {@code null} if it does not exist. */
    Versioned read(String key);

    /** Whether the file exists. */
    boolean exists(String key);

    /** Writes the whole file, replacing any (readers see the old or the new content, never a part). */
    void put(String key, byte[] data);

    /**
     * Creates the file only if absent: {@code true} if this call created it, {@code false} if the name was taken
     * (by another writer). A lost reply is retried with the same bytes, and a retry refused as taken reads the
     * file back: the same bytes mean an earlier attempt created it. Throws
     * {@link io.txcoord.client.WriteOutcomeUnknownError} when the retry bound ran out with no answer.
     */
    boolean create(String key, byte[] data);

    /**
     * Replaces the file only if it is unchanged since read with {@code etag}: whether it was replaced. A lost reply
     * is told from a refusal as in {@link #create}; {@link io.txcoord.client.WriteOutcomeUnknownError} likewise.
     */
    boolean replace(String key, byte[] data, String etag);

    /** Deletes the file; a missing file is not an error. */
    void delete(String key);

    /** The names (not keys) of the files directly under directory {@code key}. */
    List<String> list(String key);

    boolean isLocal();

    /** The file's full location, for messages. */
    String location(String key);

    @Override
    void close();
}
