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
import software.amazon.awssdk.services.s3.model.S3Object;

import java.net.URI;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Supplier;

/**
 * A lakehouse on S3 or an S3-compatible server, through the AWS SDK v2 over Apache's HTTP client (the SDK's ApacheHttpClient). Create-if-absent
 * is {@code PutObject} with {@code If-None-Match: *} (a 412 or 409 means taken); replace-if-unchanged is
 * {@code If-Match: <ETag>}. The SDK's own retries are off: this class retries a failed request within
 * {@code [storage] max_retries} and {@code retry_timeout}, with jittered exponential backoff, so that it can tell
 * a create whose reply was lost (read back: the same bytes are this client's) from one refused.
 */
public final class S3Store implements ObjectStore {
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
                // A request's own cost is what a send waits for (docs/performance.md#java-client): no CRC32 checksum
                // on a PUT or a GET (S3 requires one on none of the requests this client makes), no aws-chunked
                // encoding of a body, and no `Expect: 100-continue` round of a PUT (the bodies are a few KiB).
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
     * CPU a send waits for (docs/performance.md#java-client). For this client's requests (objects of one bucket, one
     * configuration) they give one endpoint per bucket; a resolution that fails would fail again, so it is kept too.
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

    /** Whether a failed request may succeed if made again: no answer, throttling, a server error. */
    private static boolean transientFailure(SdkException e) {
        int status = status(e);
        return status < 0 || status == 408 || status == 429 || status >= 500;
    }

    private CoordinatorException refused(String what, String key, SdkException e) {
        if (status(e) == 403) {
            return new AccessDeniedError(what + " " + location(key) + ": access denied (" + e.getMessage() + ")", e);
        }
        return new CoordinatorException(what + " " + location(key) + ": " + e.getMessage(), false, false, e);
    }

    private void backoff(int attempt, long deadline) {
        long delay = Math.min(5000, 50L << Math.min(attempt, 10));
        delay = ThreadLocalRandom.current().nextLong(delay / 2, delay + 1);
        delay = Math.max(0, Math.min(delay, deadline - System.currentTimeMillis()));
        try {
            Thread.sleep(delay);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new StorageUnavailableError("interrupted", e);
        }
    }

    /** Runs {@code request} until it answers, within the retry bound; transient failures are retried. */
    private <T> T retrying(String what, String key, Supplier<T> request) {
        long deadline = System.currentTimeMillis() + retryTimeoutMs;
        for (int attempt = 0; ; attempt++) {
            try {
                return request.get();
            } catch (SdkException e) {
                if (!transientFailure(e)) {
                    throw refused(what, key, e);
                }
                if (attempt >= maxRetries || System.currentTimeMillis() >= deadline) {
                    throw new StorageUnavailableError(what + " " + location(key) + " failed " + (attempt + 1)
                            + " times: " + e.getMessage(), e);
                }
                backoff(attempt, deadline);
            }
        }
    }

    @Override
    public Versioned read(String key) {
        return retrying("reading", key, () -> {
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
        return retrying("probing", key, () -> {
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
        retrying("writing", key, () -> s3.putObject(b -> b.bucket(bucket).key(s3Key(key)), RequestBody.fromBytes(data)));
    }

    @Override
    public boolean create(String key, byte[] data) {
        long deadline = System.currentTimeMillis() + retryTimeoutMs;
        boolean unanswered = false; // an earlier attempt may have created the file
        for (int attempt = 0; ; attempt++) {
            try {
                s3.putObject(b -> b.bucket(bucket).key(s3Key(key)).ifNoneMatch("*"), RequestBody.fromBytes(data));
                return true;
            } catch (SdkException e) {
                int status = status(e);
                if (status == 412 || status == 409) {
                    if (!unanswered) {
                        return false;
                    }
                    Versioned there = read(key);
                    return there != null && Arrays.equals(there.data(), data);
                }
                if (!transientFailure(e)) {
                    throw refused("creating", key, e);
                }
                unanswered = true;
                if (attempt >= maxRetries || System.currentTimeMillis() >= deadline) {
                    throw new WriteOutcomeUnknownError("creating " + location(key) + ": no answer after " + (attempt + 1)
                            + " attempts (" + e.getMessage() + "); it may or may not exist", e);
                }
                backoff(attempt, deadline);
            }
        }
    }

    @Override
    public boolean replace(String key, byte[] data, String etag) {
        return retrying("replacing", key, () -> {
            try {
                s3.putObject(b -> b.bucket(bucket).key(s3Key(key)).ifMatch(etag), RequestBody.fromBytes(data));
                return true;
            } catch (SdkServiceException e) {
                if (e.statusCode() == 412 || e.statusCode() == 409 || e.statusCode() == 404) {
                    return false;
                }
                throw e;
            }
        });
    }

    @Override
    public void delete(String key) {
        retrying("deleting", key, () -> s3.deleteObject(b -> b.bucket(bucket).key(s3Key(key))));
    }

    @Override
    public List<String> list(String key) {
        String dir = s3Key(key).replaceAll("/+$", "") + "/";
        List<String> names = new ArrayList<>();
        String token = null;
        do {
            String continuation = token;
            ListObjectsV2Response page = retrying("listing", key, () -> s3.listObjectsV2(
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
