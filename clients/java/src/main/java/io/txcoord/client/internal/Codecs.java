package io.txcoord.client.internal;

import org.apache.parquet.bytes.BytesInput;
import org.apache.parquet.compression.CompressionCodecFactory;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;
import org.xerial.snappy.Snappy;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.zip.GZIPInputStream;
import java.io.ByteArrayInputStream;

/**
 * Parquet's codecs without Hadoop: parquet-hadoop's own factory loads Hadoop's codec classes for snappy, so this
 * client brings its own, for the codecs Delta writers use here: snappy (snappy-java), gzip (the JDK) and none.
 */
final class Codecs implements CompressionCodecFactory {
    static final Codecs INSTANCE = new Codecs();

    private static IOException unsupported(CompressionCodecName codec) {
        return new IOException("Parquet codec " + codec + " is not supported by the txcoord Java client "
                + "(snappy, gzip and uncompressed are)");
    }

    @Override
    public BytesInputCompressor getCompressor(CompressionCodecName codec) {
        return new BytesInputCompressor() {
            @Override
            public BytesInput compress(BytesInput bytes) throws IOException {
                return switch (codec) {
                    case UNCOMPRESSED -> bytes;
                    case SNAPPY -> BytesInput.from(Snappy.compress(bytes.toByteArray()));
                    default -> throw unsupported(codec);
                };
            }

            @Override
            public CompressionCodecName getCodecName() {
                return codec;
            }

            @Override
            public void release() {
            }
        };
    }

    @Override
    public BytesInputDecompressor getDecompressor(CompressionCodecName codec) {
        return new BytesInputDecompressor() {
            @Override
            public BytesInput decompress(BytesInput bytes, int uncompressedSize) throws IOException {
                return BytesInput.from(Codecs.decompress(codec, bytes.toByteArray(), uncompressedSize));
            }

            @Override
            public void decompress(ByteBuffer input, int compressedSize, ByteBuffer output, int uncompressedSize)
                    throws IOException {
                byte[] in = new byte[compressedSize];
                input.get(in);
                output.put(Codecs.decompress(codec, in, uncompressedSize));
            }

            @Override
            public void release() {
            }
        };
    }

    static byte[] decompress(CompressionCodecName codec, byte[] in, int uncompressedSize) throws IOException {
        switch (codec) {
            case UNCOMPRESSED:
                return in;
            case SNAPPY: {
                byte[] out = new byte[uncompressedSize];
                Snappy.uncompress(in, 0, in.length, out, 0);
                return out;
            }
            case GZIP: {
                try (GZIPInputStream gz = new GZIPInputStream(new ByteArrayInputStream(in))) {
                    ByteArrayOutputStream out = new ByteArrayOutputStream(uncompressedSize);
                    gz.transferTo(out);
                    return out.toByteArray();
                }
            }
            default:
                throw unsupported(codec);
        }
    }

    @Override
    public void release() {
    }
}
