"""Re-pin the jars txcoord adds to Spark (coordinator/spark/spark-jars.lock) after changing pyspark,
delta-spark or the AWS SDK version: resolves them with Spark's Ivy from Maven Central, writes the lock
(commit it), then downloads and checks what it pins.

    .venv/bin/python scripts/lock_spark_jars.py
"""

from coordinator.spark.jars import cached_jars, lock_jars

if __name__ == "__main__":
    print(lock_jars())
    print(f"{len(cached_jars())} jars cached")
