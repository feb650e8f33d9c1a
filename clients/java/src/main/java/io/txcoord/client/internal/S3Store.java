package io.txcoord.client.internal;

import io.txcoord.client.AccessDeniedError;
import io.txcoord.client.ConfigError;
import io.txcoord.client.CoordinatorConfig;
import io.txcoord.client.CoordinatorException;
import io.txcoord.client.StorageUnavailableError;
import io.txcoord.client.WriteOutcomeUnknownError;
import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.AwsCredentialsProvider;
import software.amazon.awssdk.auth.credentials.AwsSessionCredentials;
import software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.core.ResponseBytes;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.core.exception.SdkServiceException;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.core.checksums.RequestChecksumCalculation;
import software.amazon.awssdk.core.checksums.ResponseChecksumValidation;
import software.amazon.awssdk.http.apache.ApacheHttpClient;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.endpoints.Endpoint;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.endpoints.S3EndpointParams;
import software.amazon.awssdk.services.s3.endpoints.S3EndpointProvider;
import software.amazon.awssdk.services.s3.S3ClientBuilder;
import software.amazon.awssdk.services.s3.S3Configuration;
import software.amazon.awssdk.services.s3.model.GetObjectResponse;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Request;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Response;
import software.amazon.awssdk.services.s3.model.NoSuchKeyException;
import software.amazon.awssdk.services.s3.model.PutObjectRequest;
import software.amazon.awssdk.services.s3.model.S3Object;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.net.URI;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * A lakehouse on S3 or an S3-compatible server, through the AWS SDK v2 over Apache's HTTP client. Create-if-absent
 * is {@code PutObject} with {@code If-None-Match: *} (a 412 or 409 means taken); replace-if-unchanged is
 * {@code If-Match: <ETag>}. The SDK's own retries are off: this class retries a failed request within
 * {@code [storage] max_retries} and {@code retry_timeout}, with jittered exponential backoff, so that it can tell
 * a conditional write whose reply was lost (read back: the same bytes are this client's) from one refused. 401 and
 * 403 are {@link AccessDeniedError}, at once. The errors, their wording and the log lines are the Python client's
 * (coordinator/storage.py, coordinator/retries.py).
 */
public final class S3Store implements ObjectStore {
    private static final Logger LOG = LoggerFactory.getLogger(S3Store.class);
    private final S3Client s3;
    private final String bucket;
    private final String prefix;
    private final String root;
    private final int maxRetries;
    private final long retryTimeoutMs;

    public S3Store(CoordinatorConfig config) {
        this.root = config.getLakehouse().replaceAll("/+$", "");
        URI uri = URI.create(root);
        if (uri.getHost() == null || uri.getHost().isEmpty()) {
            throw new ConfigError("an S3 lakehouse names a bucket: s3://BUCKET/PREFIX, got " + root);
        }
        this.bucket = uri.getHost();
        String path = uri.getPath() == null ? "" : uri.getPath().replaceAll("^/+|/+$", "");
        this.prefix = path.isEmpty() ? "" : path + "/";
        this.maxRetries = config.maxRetries();
        this.retryTimeoutMs = config.retryTimeoutMs();
        Map<String, String> storage = config.getStorage();
        S3ClientBuilder builder = S3Client.builder()
                .httpClientBuilder(ApacheHttpClient.builder().maxConnections(64)
                        .connectionTimeout(Duration.ofSeconds(5))
                        .socketTimeout(Duration.ofMillis(config.requestTimeoutMs())))
                .overrideConfiguration(o -> o.retryStrategy(software.amazon.awssdk.awscore.retry.AwsRetryStrategy.doNotRetry()))
                // A request's own cost is what a send waits for (docs/performance-log.md#java-client): no CRC32
                // checksum on a PUT or a GET (S3 requires one on none of the requests this client makes), no
                // aws-chunked encoding of a body, and no `Expect: 100-continue` round of a PUT (the bodies are a
                // few KiB).
                .requestChecksumCalculation(RequestChecksumCalculation.WHEN_REQUIRED)
                .responseChecksumValidation(ResponseChecksumValidation.WHEN_REQUIRED)
                .serviceConfiguration(S3Configuration.builder().chunkedEncodingEnabled(false)
                        .expectContinueEnabled(false).build());
        String region = first(storage, "aws_region", "region", "aws_default_region");
        if (region == null) {
            region = System.getenv().getOrDefault("AWS_REGION", System.getenv().getOrDefault("AWS_DEFAULT_REGION", "us-east-1"));
        }
        builder.region(Region.of(region));
        String endpoint = first(storage, "aws_endpoint", "endpoint", "aws_endpoint_url");
        if (endpoint == null) {
            endpoint = System.getenv("AWS_ENDPOINT_URL");
        }
        if (endpoint != null) {
            builder.endpointOverride(URI.create(endpoint)).forcePathStyle(true);
        }
        String virtualHosted = first(storage, "aws_virtual_hosted_style_request", "virtual_hosted_style_request");
        if (virtualHosted != null) {
            builder.forcePathStyle(!virtualHosted.equalsIgnoreCase("true"));
        }
        builder.credentialsProvider(credentials(storage));
        builder.endpointProvider(new RulesOncePerBucket());
        this.s3 = builder.build();
    }

    /**
     * S3's endpoint rules, evaluated once per bucket. The SDK evaluates them at every request, parsing the endpoint
     * again and building an exception with its stack trace for each rule that does not match (aws-sdk-java-v2#5846):
     * CPU a send waits for (docs/performance-log.md#java-client). For this client's requests (objects of one bucket,
     * one configuration) they give one endpoint per bucket; a resolution that fails would fail again, so it is kept
     * too.
     */
    private static final class RulesOncePerBucket implements S3EndpointProvider {
        private final S3EndpointProvider rules = S3EndpointProvider.defaultProvider();
        private final ConcurrentHashMap<String, CompletableFuture<Endpoint>> byBucket = new ConcurrentHashMap<>();

        @Override
        public CompletableFuture<Endpoint> resolveEndpoint(S3EndpointParams params) {
            return byBucket.computeIfAbsent(String.valueOf(params.bucket()), bucket -> rules.resolveEndpoint(params));
        }
    }

    private static String first(Map<String, String> storage, String... keys) {
        for (String key : keys) {
            for (Map.Entry<String, String> e : storage.entrySet()) {
                if (e.getKey().equalsIgnoreCase(key)) {
                    return e.getValue();
                }
            }
        }
        return null;
    }

    private static AwsCredentialsProvider credentials(Map<String, String> storage) {
        String id = first(storage, "aws_access_key_id", "access_key_id");
        String secret = first(storage, "aws_secret_access_key", "secret_access_key");
        String token = first(storage, "aws_session_token", "session_token", "aws_token", "token");
        if (id != null && secret != null) {
            return StaticCredentialsProvider.create(token != null ? AwsSessionCredentials.create(id, secret, token)
                    : AwsBasicCredentials.create(id, secret));
        }
        return DefaultCredentialsProvider.builder().build();
    }

    private String s3Key(String key) {
        return prefix + key;
    }

    private static int status(Throwable e) {
        return e instanceof SdkServiceException s ? s.statusCode() : -1;
    }

    /**
     * Why a failed request may succeed if made again, or {@code null} if it would fail the same way (refused,
     * missing, a precondition, a bad request): coordinator/retries.py's causes, so both clients log alike.
     */
    static String transientCause(SdkException e) {
        int status = status(e);
        if (status == 429 || status == 503) {
            return "throttled";
        }
        if (status >= 500) {
            return "server_error";
        }
        if (status == 408) {
            return "timeout";
        }
        if (status >= 0) {
            return null;
        }
        // No HTTP answer: the connection failed, was reset or closed before the reply, or timed out.
        String text = String.valueOf(e.getMessage()).toLowerCase(Locale.ROOT);
        return text.contains("timed out") || text.contains("timeout") ? "timeout" : "connection";
    }

    /** The error for a request the storage answered with a refusal: 401 and 403 are {@link AccessDeniedError}. */
    private CoordinatorException refused(String operation, String key, SdkException e) {
        int status = status(e);
        if (status == 401 || status == 403) {
            // coordinator/storage.py's wording: which file, that the credentials lack a grant, and where to look.
            return new AccessDeniedError(location(key) + ": access denied by the storage to these credentials "
                    + "(`txcoord grants` lists what each principal may read and write): " + operation + " answered "
                    + status + " (" + firstLine(e) + ")", e);
        }
        return new CoordinatorException(location(key) + ": " + operation + " refused: " + firstLine(e), false, false, e);
    }

    private static String firstLine(Throwable e) {
        String text = String.valueOf(e.getMessage()).strip();
        int newline = text.indexOf('\n');
        return newline < 0 ? text : text.substring(0, newline);
    }

    /** Exponential backoff with jitter, as coordinator/retries.py's: 50 ms doubling, plus up to 0.5 s, at most 5 s. */
    private static void backoff(int attempt, long deadline) throws InterruptedException {
        long delay = Math.min(5000, (50L << Math.min(attempt, 10)) + ThreadLocalRandom.current().nextLong(501));
        Thread.sleep(Math.max(0, Math.min(delay, deadline - System.currentTimeMillis())));
    }

    /**
     * Runs {@code request} until it answers, within {@code [storage] max_retries} and {@code retry_timeout}: each
     * failure with a {@link #transientCause} is logged and retried, any other thrown at once ({@link #refused}). Out
     * of retries: {@link StorageUnavailableError}, or {@link WriteOutcomeUnknownError} for a
     * {@code conditionalWrite}, whose outcome nobody can know then. {@code attempts[0]} counts the attempts made.
     */
    private <T> T retrying(String operation, String key, boolean conditionalWrite, int[] attempts, Supplier<T> request) {
        long started = System.currentTimeMillis();
        long deadline = started + retryTimeoutMs;
        for (int attempt = 0; ; attempt++) {
            attempts[0] = attempt + 1;
            try {
                return request.get();
            } catch (SdkException e) {
                String cause = transientCause(e);
                if (cause == null) {
                    throw refused(operation, key, e);
                }
                if (attempt >= maxRetries || System.currentTimeMillis() >= deadline) {
                    String message = String.format(Locale.ROOT, "%s: %s failed %d time(s) in %.1f s (the bound "
                                    + "is %d retries and %s s: the [storage] settings max_retries and retry_timeout); "
                                    + "last: %s: %s", location(key), operation, attempt + 1,
                            (System.currentTimeMillis() - started) / 1000.0, maxRetries, seconds(retryTimeoutMs),
                            e.getClass().getSimpleName(), firstLine(e));
                    LOG.error(message);
                    throw conditionalWrite ? new WriteOutcomeUnknownError(message, e) : new StorageUnavailableError(message, e);
                }
                LOG.warn("{}: {} retried (attempt {}) after {}: {}: {}", location(key), operation, attempt + 2, cause,
                        e.getClass().getSimpleName(), firstLine(e));
                try {
                    backoff(attempt, deadline);
                } catch (InterruptedException interrupted) {
                    Thread.currentThread().interrupt();
                    String message = location(key) + ": " + operation + " interrupted while waiting to retry";
                    throw conditionalWrite ? new WriteOutcomeUnknownError(message, e) : new StorageUnavailableError(message, e);
                }
            }
        }
    }

    private <T> T retrying(String operation, String key, Supplier<T> request) {
        return retrying(operation, key, false, new int[1], request);
    }

    private static String seconds(long ms) {
        return ms % 1000 == 0 ? Long.toString(ms / 1000) : Double.toString(ms / 1000.0);
    }

    @Override
    public Versioned read(String key) {
        return retrying("read", key, () -> {
            try {
                ResponseBytes<GetObjectResponse> got = s3.getObjectAsBytes(b -> b.bucket(bucket).key(s3Key(key)));
                GetObjectResponse r = got.response();
                return new Versioned(got.asByteArray(), r.eTag(), r.lastModified() == null ? 0 : r.lastModified().toEpochMilli());
            } catch (NoSuchKeyException e) {
                return null;
            } catch (SdkServiceException e) {
                if (e.statusCode() == 404) {
                    return null;
                }
                throw e;
            }
        });
    }

    @Override
    public boolean exists(String key) {
        return retrying("exists", key, () -> {
            try {
                s3.headObject(b -> b.bucket(bucket).key(s3Key(key)));
                return true;
            } catch (SdkServiceException e) {
                if (e.statusCode() == 404) {
                    return false;
                }
                throw e;
            }
        });
    }

    @Override
    public void put(String key, byte[] data) {
        retrying("put", key, () -> s3.putObject(b -> b.bucket(bucket).key(s3Key(key)), RequestBody.fromBytes(data)));
    }

    @Override
    public boolean create(String key, byte[] data) {
        return conditionalPut("create", key, data, b -> b.ifNoneMatch("*"), Set.of(412, 409));
    }

    @Override
    public boolean replace(String key, byte[] data, String etag) {
        return conditionalPut("replace", key, data, b -> b.ifMatch(etag), Set.of(412, 409, 404));
    }

    /**
     * {@code data} put at {@code key} under {@code condition}, retried: whether it was written. Refused (one of
     * {@code refusedStatuses}) on the first attempt: another writer's, {@code false}. Refused on a later attempt: an
     * earlier one may have been made and its reply lost, so the file is read: holding exactly {@code data}, it is
     * this writer's ({@code true}; every caller's content is its own: a commit names its data file by UUID, a claim
     * or a record its instance), else another's. As coordinator/storage.py's {@code _conditional_put}.
     */
    private boolean conditionalPut(String operation, String key, byte[] data,
                                   Consumer<PutObjectRequest.Builder> condition,
                                   Set<Integer> refusedStatuses) {
        int[] attempts = new int[1];
        boolean written = retrying(operation, key, true, attempts, () -> {
            try {
                s3.putObject(b -> condition.accept(b.bucket(bucket).key(s3Key(key))), RequestBody.fromBytes(data));
                return true;
            } catch (SdkServiceException e) {
                if (refusedStatuses.contains(e.statusCode())) {
                    return false;
                }
                throw e;
            }
        });
        if (written || attempts[0] == 1) {
            return written;
        }
        Versioned there = read(key);
        if (there == null || !Arrays.equals(there.data(), data)) {
            return false;
        }
        LOG.warn("{}: {} found already made by this writer (an earlier attempt's reply was lost); taken as done",
                location(key), operation);
        return true;
    }

    @Override
    public void delete(String key) {
        retrying("delete", key, () -> s3.deleteObject(b -> b.bucket(bucket).key(s3Key(key))));
    }

    @Override
    public List<String> list(String key) {
        String dir = s3Key(key).replaceAll("/+$", "") + "/";
        List<String> names = new ArrayList<>();
        String token = null;
        do {
            String continuation = token;
            ListObjectsV2Response page = retrying("list", key, () -> s3.listObjectsV2(
                    ListObjectsV2Request.builder().bucket(bucket).prefix(dir).delimiter("/").continuationToken(continuation).build()));
            for (S3Object object : page.contents()) {
                names.add(object.key().substring(dir.length()));
            }
            token = Boolean.TRUE.equals(page.isTruncated()) ? page.nextContinuationToken() : null;
        } while (token != null);
        return names;
    }

    @Override
    public boolean isLocal() {
        return false;
    }

    @Override
    public String location(String key) {
        return root + "/" + key;
    }

    @Override
    public void close() {
        s3.close();
    }
}
