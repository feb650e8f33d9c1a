package io.txcoord.client.internal;

import io.txcoord.client.AccessDeniedError;
import io.txcoord.client.CoordinatorException;
import io.txcoord.client.StorageUnavailableError;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.file.AccessDeniedException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.stream.Stream;

/**
 * A lakehouse in a local directory. Create-if-absent is link(2): the content goes to a temporary name in the same
 * directory, then {@link Files#createLink} gives it the final name, which fails if the name is taken, so the file
 * appears whole or not at all ({@code Files.move} without REPLACE_EXISTING is no such guarantee: on Linux it
 * checks for the target and then renames, a window in which another writer's file would be replaced).
 * Replace-if-unchanged holds {@code flock} on {@code .<name>.lock}, compares the content, then renames a
 * temporary file over the name.
 */
public final class LocalStore implements ObjectStore {
    private final Path root;

    public LocalStore(String root) {
        String path = root.startsWith("file://") ? root.substring("file://".length()) : root;
        this.root = Paths.get(path).toAbsolutePath();
    }

    private Path path(String key) {
        return root.resolve(key);
    }

    static String digest(byte[] data) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(data));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    private static CoordinatorException failure(String what, String key, IOException e) {
        if (e instanceof AccessDeniedException) {
            return new AccessDeniedError(what + " " + key + ": permission denied", e);
        }
        return new StorageUnavailableError(what + " " + key + ": " + e, e);
    }

    @Override
    public Versioned read(String key) {
        Path p = path(key);
        try {
            long modified = Files.getLastModifiedTime(p).toMillis();
            byte[] data = Files.readAllBytes(p);
            return new Versioned(data, digest(data), modified);
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            throw failure("reading", key, e);
        }
    }

    @Override
    public boolean exists(String key) {
        return Files.exists(path(key));
    }

    /** What gives a temporary file, written whole, its final name. */
    private interface Publish {
        void to(Path target, Path temp) throws IOException;
    }

    /** Writes {@code data} to a temporary file beside {@code key}'s, then {@code publish}es it; the temporary
     * file is gone afterwards, whatever happened. */
    private void writeAndPublish(Path target, byte[] data, Publish publish) throws IOException {
        Files.createDirectories(target.getParent());
        Path temp = target.resolveSibling("." + target.getFileName() + "." + Long.toHexString(ThreadLocalRandom.current().nextLong()));
        try {
            Files.write(temp, data, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE);
            publish.to(target, temp);
        } finally {
            Files.deleteIfExists(temp);
        }
    }

    @Override
    public void put(String key, byte[] data) {
        try {
            writeAndPublish(path(key), data, (target, temp) ->
                    Files.move(temp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING));
        } catch (IOException e) {
            throw failure("writing", key, e);
        }
    }

    @Override
    public boolean create(String key, byte[] data) {
        try {
            writeAndPublish(path(key), data, (target, temp) -> Files.createLink(target, temp));
            return true;
        } catch (FileAlreadyExistsException e) {
            return false;
        } catch (IOException e) {
            throw failure("creating", key, e);
        }
    }

    @Override
    public boolean replace(String key, byte[] data, String etag) {
        Path target = path(key);
        Path lock = target.resolveSibling("." + target.getFileName() + ".lock");
        try {
            Files.createDirectories(target.getParent());
            try (FileChannel channel = FileChannel.open(lock, StandardOpenOption.CREATE, StandardOpenOption.WRITE);
                 FileLock ignored = channel.lock()) {
                byte[] current;
                try {
                    current = Files.readAllBytes(target);
                } catch (NoSuchFileException e) {
                    return false;
                }
                if (!digest(current).equals(etag)) {
                    return false;
                }
                put(key, data);
                return true;
            }
        } catch (IOException e) {
            throw failure("replacing", key, e);
        }
    }

    @Override
    public void delete(String key) {
        try {
            Files.deleteIfExists(path(key));
        } catch (IOException e) {
            throw failure("deleting", key, e);
        }
    }

    @Override
    public List<String> list(String key) {
        List<String> names = new ArrayList<>();
        try (Stream<Path> files = Files.list(path(key))) {
            files.forEach(p -> names.add(p.getFileName().toString()));
        } catch (NoSuchFileException e) {
            return names;
        } catch (IOException e) {
            throw failure("listing", key, e);
        }
        return names;
    }

    @Override
    public boolean isLocal() {
        return true;
    }

    @Override
    public String location(String key) {
        return path(key).toString();
    }

    @Override
    public void close() {
    }
}
