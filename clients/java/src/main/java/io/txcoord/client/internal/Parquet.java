package io.txcoord.client.internal;

import org.apache.parquet.bytes.BytesInput;
import org.apache.parquet.column.ColumnDescriptor;
import org.apache.parquet.column.Encoding;
import org.apache.parquet.column.page.DataPage;
import org.apache.parquet.column.page.DataPageV1;
import org.apache.parquet.column.page.DataPageV2;
import org.apache.parquet.column.page.DictionaryPage;
import org.apache.parquet.column.page.PageReadStore;
import org.apache.parquet.column.page.PageReader;
import org.apache.parquet.conf.PlainParquetConfiguration;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.example.data.simple.convert.GroupRecordConverter;
import org.apache.parquet.format.DataPageHeader;
import org.apache.parquet.format.DataPageHeaderV2;
import org.apache.parquet.format.DictionaryPageHeader;
import org.apache.parquet.format.PageHeader;
import org.apache.parquet.format.Util;
import org.apache.parquet.format.converter.ParquetMetadataConverter;
import org.apache.parquet.hadoop.ParquetFileWriter;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.example.ExampleParquetWriter;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ColumnChunkMetaData;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.io.ColumnIOFactory;
import org.apache.parquet.io.OutputFile;
import org.apache.parquet.io.PositionOutputStream;
import org.apache.parquet.io.RecordReader;
import org.apache.parquet.io.api.Binary;
import org.apache.parquet.schema.GroupType;
import org.apache.parquet.schema.LogicalTypeAnnotation;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.PrimitiveType;
import org.apache.parquet.schema.Type;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;

/**
 * Parquet files in memory, without Hadoop: written with parquet-java's writer over a byte array (Parquet's own
 * configuration and {@link Codecs}), read by walking the footer's column chunks and pages into parquet-java's
 * record assembly (its file reader's options class loads Hadoop's MapReduce classes).
 */
public final class Parquet {
    private static final long JULIAN_EPOCH_DAY = 2_440_588L;

    private Parquet() {
    }

    /** A Parquet file of {@code rows} (each filled by {@code fill}) in {@code schema}, snappy-compressed. */
    public static <T> byte[] write(MessageType schema, List<T> rows, java.util.function.BiConsumer<T, Group> fill)
            throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream(4096);
        org.apache.parquet.example.data.simple.SimpleGroupFactory factory =
                new org.apache.parquet.example.data.simple.SimpleGroupFactory(schema);
        try (ParquetWriter<Group> writer = ExampleParquetWriter.builder(new MemoryOutputFile(out))
                .withConf(new PlainParquetConfiguration())
                .withCodecFactory(Codecs.INSTANCE)
                .withCompressionCodec(CompressionCodecName.SNAPPY)
                .withType(schema)
                .withWriteMode(ParquetFileWriter.Mode.OVERWRITE)
                .withDictionaryEncoding(false)
                .withPageWriteChecksumEnabled(false)
                .withPageSize(64 * 1024)
                .withDictionaryPageSize(64 * 1024)
                .withRowGroupSize(64L * 1024 * 1024)
                .withStatisticsTruncateLength(64)
                .withColumnIndexTruncateLength(64)
                .build()) {
            for (T row : rows) {
                Group group = factory.newGroup();
                fill.accept(row, group);
                writer.write(group);
            }
        }
        return out.toByteArray();
    }

    /** Every row of a Parquet file, as column name to Java value ({@link #toJava}). */
    public static List<Map<String, Object>> read(byte[] file) throws IOException {
        List<Map<String, Object>> rows = new ArrayList<>();
        read(file, group -> rows.add(toJava(group)));
        return rows;
    }

    /** Hands every row of a Parquet file to {@code sink}. */
    public static void read(byte[] file, Consumer<Group> sink) throws IOException {
        int n = file.length;
        if (n < 12 || !tail(file, n - 4).equals("PAR1")) {
            throw new IOException("not a Parquet file (" + n + " bytes)");
        }
        int footerLength = ByteBuffer.wrap(file, n - 8, 4).order(ByteOrder.LITTLE_ENDIAN).getInt();
        if (footerLength <= 0 || footerLength > n - 12) {
            throw new IOException("bad Parquet footer length " + footerLength);
        }
        ParquetMetadataConverter converter = new ParquetMetadataConverter();
        org.apache.parquet.format.FileMetaData thrift =
                Util.readFileMetaData(new ByteArrayInputStream(file, n - 8 - footerLength, footerLength));
        ParquetMetadata metadata = converter.fromParquetMetadata(thrift);
        MessageType schema = metadata.getFileMetaData().getSchema();
        for (BlockMetaData block : metadata.getBlocks()) {
            Map<List<String>, ChunkPages> chunks = new HashMap<>();
            for (ColumnChunkMetaData chunk : block.getColumns()) {
                chunks.put(List.of(chunk.getPath().toArray()), pages(file, chunk, converter));
            }
            long rowCount = block.getRowCount();
            PageReadStore store = new PageReadStore() {
                @Override
                public PageReader getPageReader(ColumnDescriptor column) {
                    ChunkPages pages = chunks.get(List.of(column.getPath()));
                    if (pages == null) {
                        throw new IllegalStateException("no column chunk for " + String.join(".", column.getPath()));
                    }
                    return pages;
                }

                @Override
                public long getRowCount() {
                    return rowCount;
                }
            };
            RecordReader<Group> reader = new ColumnIOFactory().getColumnIO(schema)
                    .getRecordReader(store, new GroupRecordConverter(schema));
            for (long i = 0; i < rowCount; i++) {
                sink.accept(reader.read());
            }
        }
    }

    private static String tail(byte[] file, int from) {
        return new String(file, from, 4, StandardCharsets.US_ASCII);
    }

    private static final class ChunkPages implements PageReader {
        final Deque<DataPage> pages = new ArrayDeque<>();
        DictionaryPage dictionary;
        long values;

        @Override
        public DictionaryPage readDictionaryPage() {
            return dictionary;
        }

        @Override
        public long getTotalValueCount() {
            return values;
        }

        @Override
        public DataPage readPage() {
            return pages.poll();
        }
    }

    private static ChunkPages pages(byte[] file, ColumnChunkMetaData chunk, ParquetMetadataConverter converter)
            throws IOException {
        ChunkPages result = new ChunkPages();
        long start = chunk.getStartingPos();
        long size = chunk.getTotalSize();
        if (start < 0 || size < 0 || start + size > file.length) {
            throw new IOException("column chunk outside the file");
        }
        ByteArrayInputStream in = new ByteArrayInputStream(file, (int) start, (int) size);
        CompressionCodecName codec = chunk.getCodec();
        long seen = 0;
        while (seen < chunk.getValueCount() && in.available() > 0) {
            PageHeader header = Util.readPageHeader(in);
            byte[] raw = in.readNBytes(header.getCompressed_page_size());
            if (raw.length != header.getCompressed_page_size()) {
                throw new IOException("truncated page");
            }
            switch (header.getType()) {
                case DICTIONARY_PAGE -> {
                    DictionaryPageHeader h = header.getDictionary_page_header();
                    result.dictionary = new DictionaryPage(
                            BytesInput.from(Codecs.decompress(codec, raw, header.getUncompressed_page_size())),
                            h.getNum_values(), converter.getEncoding(h.getEncoding()));
                }
                case DATA_PAGE -> {
                    DataPageHeader h = header.getData_page_header();
                    byte[] data = Codecs.decompress(codec, raw, header.getUncompressed_page_size());
                    result.pages.add(new DataPageV1(BytesInput.from(data), h.getNum_values(), data.length, null,
                            converter.getEncoding(h.getRepetition_level_encoding()),
                            converter.getEncoding(h.getDefinition_level_encoding()),
                            converter.getEncoding(h.getEncoding())));
                    seen += h.getNum_values();
                }
                case DATA_PAGE_V2 -> {
                    DataPageHeaderV2 h = header.getData_page_header_v2();
                    int rl = h.getRepetition_levels_byte_length();
                    int dl = h.getDefinition_levels_byte_length();
                    byte[] values = java.util.Arrays.copyOfRange(raw, rl + dl, raw.length);
                    boolean compressed = !h.isSetIs_compressed() || h.isIs_compressed();
                    if (compressed) {
                        values = Codecs.decompress(codec, values, header.getUncompressed_page_size() - rl - dl);
                    }
                    result.pages.add(DataPageV2.uncompressed(h.getNum_rows(), h.getNum_nulls(), h.getNum_values(),
                            BytesInput.from(java.util.Arrays.copyOfRange(raw, 0, rl)),
                            BytesInput.from(java.util.Arrays.copyOfRange(raw, rl, rl + dl)),
                            converter.getEncoding(h.getEncoding()), BytesInput.from(values), null));
                    seen += h.getNum_values();
                }
                default -> {
                    // index pages: nothing to read
                }
            }
        }
        result.values = seen;
        return result;
    }

    /**
     * A row as plain Java values: strings, integers, longs, byte arrays, {@link Instant}s for timestamps (INT96, or
     * INT64 with a TIMESTAMP annotation), maps for MAP groups, lists for LIST groups, maps for other groups; an
     * absent value is {@code null}.
     */
    public static Map<String, Object> toJava(Group group) {
        GroupType type = group.getType();
        Map<String, Object> row = new LinkedHashMap<>();
        for (int i = 0; i < type.getFieldCount(); i++) {
            Type field = type.getType(i);
            if (field.isRepetition(Type.Repetition.REPEATED)) {
                List<Object> values = new ArrayList<>();
                for (int j = 0; j < group.getFieldRepetitionCount(i); j++) {
                    values.add(value(group, i, j, field));
                }
                row.put(field.getName(), values);
            } else {
                row.put(field.getName(), group.getFieldRepetitionCount(i) == 0 ? null : value(group, i, 0, field));
            }
        }
        return row;
    }

    private static Object value(Group group, int field, int index, Type type) {
        if (!type.isPrimitive()) {
            Group inner = group.getGroup(field, index);
            LogicalTypeAnnotation annotation = type.getLogicalTypeAnnotation();
            if (annotation instanceof LogicalTypeAnnotation.MapLogicalTypeAnnotation
                    || type.getOriginalType() == org.apache.parquet.schema.OriginalType.MAP_KEY_VALUE) {
                Map<Object, Object> map = new LinkedHashMap<>();
                if (inner.getType().getFieldCount() > 0) {
                    Type entryType = inner.getType().getType(0);
                    for (int j = 0; j < inner.getFieldRepetitionCount(0); j++) {
                        Map<String, Object> entry = toJava(inner.getGroup(0, j));
                        List<Object> kv = new ArrayList<>(entry.values());
                        map.put(kv.isEmpty() ? null : kv.get(0), kv.size() > 1 ? kv.get(1) : null);
                    }
                    entryType.getName();
                }
                return map;
            }
            if (annotation instanceof LogicalTypeAnnotation.ListLogicalTypeAnnotation) {
                List<Object> list = new ArrayList<>();
                if (inner.getType().getFieldCount() > 0) {
                    Type elementType = inner.getType().getType(0);
                    for (int j = 0; j < inner.getFieldRepetitionCount(0); j++) {
                        Object element = value(inner, 0, j, elementType);
                        if (element instanceof Map<?, ?> m && !elementType.isPrimitive() && m.size() == 1) {
                            element = m.values().iterator().next(); // the 3-level list's element group
                        }
                        list.add(element);
                    }
                }
                return list;
            }
            return toJava(inner);
        }
        PrimitiveType primitive = type.asPrimitiveType();
        LogicalTypeAnnotation annotation = primitive.getLogicalTypeAnnotation();
        switch (primitive.getPrimitiveTypeName()) {
            case INT32:
                return group.getInteger(field, index);
            case INT64: {
                long v = group.getLong(field, index);
                if (annotation instanceof LogicalTypeAnnotation.TimestampLogicalTypeAnnotation ts) {
                    return switch (ts.getUnit()) {
                        case MILLIS -> Instant.ofEpochMilli(v);
                        case MICROS -> Instant.ofEpochSecond(Math.floorDiv(v, 1_000_000L), Math.floorMod(v, 1_000_000L) * 1000);
                        case NANOS -> Instant.ofEpochSecond(Math.floorDiv(v, 1_000_000_000L), Math.floorMod(v, 1_000_000_000L));
                    };
                }
                return v;
            }
            case INT96: {
                ByteBuffer b = group.getInt96(field, index).toByteBuffer().order(ByteOrder.LITTLE_ENDIAN);
                long nanosOfDay = b.getLong();
                long julianDay = Integer.toUnsignedLong(b.getInt());
                return Instant.ofEpochSecond((julianDay - JULIAN_EPOCH_DAY) * 86_400L).plusNanos(nanosOfDay);
            }
            case BOOLEAN:
                return group.getBoolean(field, index);
            case FLOAT:
                return group.getFloat(field, index);
            case DOUBLE:
                return group.getDouble(field, index);
            default: {
                Binary binary = group.getBinary(field, index);
                if (annotation instanceof LogicalTypeAnnotation.StringLogicalTypeAnnotation
                        || annotation instanceof LogicalTypeAnnotation.EnumLogicalTypeAnnotation
                        || annotation instanceof LogicalTypeAnnotation.JsonLogicalTypeAnnotation) {
                    return binary.toStringUsingUTF8();
                }
                return binary.getBytes();
            }
        }
    }

    /** An {@link OutputFile} over a byte array. */
    private static final class MemoryOutputFile implements OutputFile {
        private final ByteArrayOutputStream out;

        MemoryOutputFile(ByteArrayOutputStream out) {
            this.out = out;
        }

        @Override
        public PositionOutputStream create(long blockSizeHint) {
            return stream();
        }

        @Override
        public PositionOutputStream createOrOverwrite(long blockSizeHint) {
            out.reset();
            return stream();
        }

        private PositionOutputStream stream() {
            return new PositionOutputStream() {
                @Override
                public long getPos() {
                    return out.size();
                }

                @Override
                public void write(int b) {
                    out.write(b);
                }

                @Override
                public void write(byte[] b, int off, int len) {
                    out.write(b, off, len);
                }
            };
        }

        @Override
        public boolean supportsBlockSize() {
            return false;
        }

        @Override
        public long defaultBlockSize() {
            return 128L << 20;
        }

        @Override
        public String getPath() {
            return "memory";
        }
    }
}
