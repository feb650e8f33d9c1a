package io.txcoord.spark;

import java.io.IOException;
import java.io.UncheckedIOException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's streaming checkpoint files written on S3 with one request each: a PUT that the store refuses when
 * the file exists (If-None-Match, through S3A's conditional create), where Spark's own managers check for the
 * file and its parent first, some of it twice (docs/performance.md, "The checker at 500 txn/s"). The upload is
 * S3A's: nothing appears until it completes, and a cancelled one never does. Everything but writing is
 * Spark's FileSystem-based manager.
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
      return new Upload((FSDataOutputStream) create.build());
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** An upload that completes on close and is abandoned, never completed, on cancel. */
  private static final class Upload extends CheckpointFileManager.CancellableFSDataOutputStream {
    private final FSDataOutputStream upload;

    Upload(FSDataOutputStream upload) {
      super(upload);
      this.upload = upload;
    }

    @Override
    public void cancel() {
      upload.abort();
    }
  }
}
