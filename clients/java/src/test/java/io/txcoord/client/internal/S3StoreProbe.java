package io.txcoord.client.internal;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.txcoord.client.CoordinatorConfig;
import io.txcoord.client.CoordinatorException;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;

/**
 * {@link S3Store} driven one operation a line, for tests/test_java_client_storage.py: it puts the fault proxy
 * (coordinator/conformance/faults.py) between this store and the real S3 server and tells it which fault the next request gets.
 * Ops on stdin ({@code {"op": "create", "key": "k", "data": "text"}}; also {@code read}, {@code replace} with
 * {@code etag}, {@code put}), one reply a line on stdout: {@code {"ok": true, "result": ...}}, or the error as the
 * conformance driver says it ({@code error}, {@code retriable}, {@code outcome_unknown}, {@code message}).
 *
 * <pre>
 * java -cp "target/txcoord-client-0.1.0.jar:target/lib/*:target/examples-lib/*" \
 *     src/test/java/io/txcoord/client/internal/S3StoreProbe.java --config store.toml
 * </pre>
 */
public final class S3StoreProbe {
    private static final ObjectMapper JSON = new ObjectMapper();

    private S3StoreProbe() {
    }

    static ObjectNode handle(S3Store store, JsonNode op) {
        ObjectNode reply = JSON.createObjectNode();
        String key = op.path("key").asText();
        byte[] data = op.path("data").asText().getBytes(StandardCharsets.UTF_8);
        try {
            switch (op.path("op").asText()) {
                case "create" -> reply.put("result", store.create(key, data));
                case "replace" -> reply.put("result", store.replace(key, data, op.path("etag").asText()));
                case "put" -> {
                    store.put(key, data);
                    reply.putNull("result");
                }
                case "read" -> {
                    ObjectStore.Versioned file = store.read(key);
                    if (file == null) {
                        reply.putNull("result");
                    } else {
                        reply.putObject("result").put("data", new String(file.data(), StandardCharsets.UTF_8))
                                .put("etag", file.etag());
                    }
                }
                default -> throw new IllegalArgumentException("unknown op " + op.path("op"));
            }
            reply.put("ok", true);
        } catch (CoordinatorException e) {
            reply.put("ok", false);
            reply.put("error", e.errorName());
            reply.put("retriable", e.retriable());
            reply.put("outcome_unknown", e.outcomeUnknown());
            reply.put("message", e.getMessage());
        }
        return reply;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2 || !args[0].equals("--config")) {
            throw new IllegalArgumentException("usage: S3StoreProbe --config FILE");
        }
        try (S3Store store = new S3Store(CoordinatorConfig.load(Path.of(args[1])))) {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                System.out.println(handle(store, JSON.readTree(line)));
                System.out.flush();
            }
        }
    }
}
