"""The batch job over the captured data: ``--sql`` and ``--job module:function``.

Both see the same temporary views: ``frames``, ``messages``, ``problems`` and
every report (``connections``, ``audit``, ``flow_control``, ``restarts``,
``twopc``, ``violations``). A Python job is a function that takes the
``messages`` DataFrame and returns a DataFrame; it can reach the other views
with ``messages.sparkSession.table(name)``. A job module that is a plain file
(not an installed package) is shipped to the executors, so UDFs in it work on
a cluster too.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class JobError(Exception):
    """A --sql or --job the user gave cannot run: what is wrong with it."""


def register_views(tables: Mapping[str, DataFrame]) -> None:
    """Make each DataFrame queryable by its name."""
    for name, frame in tables.items():
        frame.createOrReplaceTempView(name)


def run_sql(spark: SparkSession, query: str) -> DataFrame:
    """Plan ``query`` against the views; a bad query is a JobError with Spark's own reason."""
    from pyspark.errors import PySparkException

    try:
        return spark.sql(query)
    except PySparkException as err:
        raise JobError(f"--sql failed: {_short(err)}") from None


def load_job(spec: str) -> Callable:
    """Import ``module:function`` (the current directory is searched too)."""
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise JobError(
            f"--job {spec!r}: expected MODULE:FUNCTION, e.g. wallaroo_proto.spark.example_job:key_counts"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise JobError(f"--job {spec!r}: cannot import module {module_name!r}: {err}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise JobError(f"--job {spec!r}: module {module_name!r} has no function {function_name!r}")
    return function


def ship_job_module(spark: SparkSession, function: Callable) -> None:
    """Send a job's module file to the executors when it is not part of an installed package."""
    module = inspect.getmodule(function)
    path = getattr(module, "__file__", None)
    if not path or module is None or "." in module.__name__ or "site-packages" in path:
        return
    spark.sparkContext.addPyFile(path)


def run_job(spark: SparkSession, spec: str, messages: DataFrame) -> DataFrame:
    """Call the job on ``messages``; it must return a DataFrame."""
    from pyspark.sql import DataFrame

    function = load_job(spec)
    ship_job_module(spark, function)
    try:
        result = function(messages)
    except JobError:
        raise
    except Exception as err:
        raise JobError(f"--job {spec!r} raised {type(err).__name__}: {_short(err)}") from None
    if not isinstance(result, DataFrame):
        raise JobError(f"--job {spec!r} returned {type(result).__name__}, not a DataFrame")
    return result


def _short(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:500] if text else type(err).__name__


FORMATS = ("parquet", "csv", "json")


def flatten_for_csv(frame: DataFrame) -> DataFrame:
    """CSV holds no arrays, structs or binary: those become JSON text and base64."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql import types as T  # noqa: N812

    columns = []
    for field in frame.schema.fields:
        column = F.col(f"`{field.name}`")
        if isinstance(field.dataType, (T.ArrayType, T.StructType, T.MapType)):
            column = F.to_json(column)
        elif isinstance(field.dataType, T.BinaryType):
            column = F.base64(column)
        columns.append(column.alias(field.name))
    return frame.select(*columns)


#: Tables written at once: each write is a small Spark job whose time goes mostly to planning and
#: scheduling, which several at once overlap (Spark runs jobs from several threads side by side).
WRITERS = 4


def write_tables(tables: Mapping[str, DataFrame], directory: str, fmt: str = "parquet") -> dict[str, str]:
    """Write each table to ``directory/<name>`` (replacing an earlier run's); name -> path."""
    if fmt not in FORMATS:
        raise JobError(f"unknown output format {fmt!r} (choose from {', '.join(FORMATS)})")

    def write(name: str, frame: DataFrame) -> str:
        path = os.path.join(directory, name)
        out = flatten_for_csv(frame) if fmt == "csv" else frame
        writer = out.write.mode("overwrite")
        if fmt == "csv":  # RFC 4180 quoting ("" inside quotes), as spreadsheets and csv readers expect
            writer = writer.option("header", True).option("escape", '"')
        getattr(writer, fmt)(path)
        return path

    pool = ThreadPoolExecutor(WRITERS)
    try:
        paths = {name: pool.submit(write, name, frame) for name, frame in tables.items()}
        return {name: path.result() for name, path in paths.items()}  # the first failure raised
    finally:  # a failure or Ctrl-C starts no more writes
        pool.shutdown(wait=False, cancel_futures=True)
