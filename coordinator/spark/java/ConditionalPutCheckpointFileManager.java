package io.txcoord.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Arrays;

import org.apache.commons.io.output.TeeOutputStream;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's streaming checkpoint files written on S3 with one request each: a PUT that the store refuses when
 * the file exists (If-None-Match, through S3A's conditional create), where Spark's own managers check for the
 * file and its parent first, some of it twice
 * (docs/performance-log.md#the-checker-at-500-txns-25-ms-a-request-issue-45-point-3). The upload is
 * S3A's: nothing appears until it completes, and a cancelled one never does. Everything but writing is
 * Spark's FileSystem-based manager.
 *
 * A PUT whose reply was lost and that the S3 client sent again is refused by the file its first attempt
 * wrote: a refused write counts as done when the file holds exactly the bytes written, as a retried
 * unconditional PUT would have left it.
 *
 * Set as spark.sql.streaming.checkpointFileManagerClass for a checkpoint on S3 only: another filesystem
 * refuses the mandatory conditional-create option.
 */
public final class ConditionalPutCheckpointFileManager extends FileSystemBasedCheckpointFileManager {
  private static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";
  private static final String SKIP_CREATE_CHECKS = "fs.s3a.create.performance";

  public ConditionalPutCheckpointFileManager(Path path, Configuration hadoopConf) {
    super(path, hadoopConf);
  }

  @Override
  public CheckpointFileManager.CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
    try {
      // recursive, as Spark's own create: no check of the parent (on a disk, it is made if missing).
      var create = fs().createFile(path).recursive().overwrite(overwriteIfPossible).opt(SKIP_CREATE_CHECKS, true);
      if (!overwriteIfPossible) {
        create = create.must(CONDITIONAL_CREATE, true);
      }
      return new Upload((FSDataOutputStream) create.build(), fs(), path);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** An upload that completes on close and is abandoned, never completed, on cancel. */
  private static final class Upload extends CheckpointFileManager.CancellableFSDataOutputStream {
    private final FSDataOutputStream upload;
    private final ByteArrayOutputStream written;
    private final FileSystem fs;
    private final Path path;

    Upload(FSDataOutputStream upload, FileSystem fs, Path path) {
      this(upload, new ByteArrayOutputStream(), fs, path);
    }

    private Upload(FSDataOutputStream upload, ByteArrayOutputStream written, FileSystem fs, Path path) {
      super(new TeeOutputStream(upload, written));  // writes to the upload, and keeps a copy
      this.upload = upload;
      this.written = written;
      this.fs = fs;
      this.path = path;
    }

    @Override
    public void close() throws IOException {
      try {
        super.close();
      } catch (IOException refused) {
        if (!holdsWhatWasWritten()) {
          throw refused;
        }
      }
    }

    @Override
    public void cancel() {
      upload.abort();
    }

    private boolean holdsWhatWasWritten() {
      byte[] expected = written.toByteArray();
      try (InputStream found = fs.open(path)) {
        return Arrays.equals(found.readNBytes(expected.length + 1), expected);
      } catch (IOException unreadable) {
        return false;
      }
    }
  }
}
