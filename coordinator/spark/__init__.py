"""Spark for txcoord's jobs and notebooks (``pip install 'txcoord[spark]'``).

- :mod:`.session`: the one session factory, with the settings this package ships;
- :mod:`.jars`: the Delta, S3A and ABFS jars it launches with, locked, downloaded once into the user's cache;
- :mod:`.class_archive`: the driver JVM's class archive, written once, mapped by every later start;
- :mod:`.submit`: what ``spark-submit`` needs to run the jobs from an installed package.

Example::

    from coordinator.spark import get_spark
    spark = get_spark("analysis")
"""

from coordinator.spark.session import get_spark, lakehouse_spark, object_store_conf
from coordinator.spark.submit import job_script, spark_job_environment, spark_submit, submit_properties

__all__ = ["get_spark", "job_script", "lakehouse_spark", "object_store_conf", "spark_job_environment", "spark_submit",
           "submit_properties"]
