"""spark-replay: captures into a PySpark batch job.

``session`` starts Spark (quietly, shipping this package to the executors), ``plan``
lists the captures and shares them out into tasks,
``frames`` reads captures on the executors into the ``frames`` DataFrame,
``reports`` derives messages, the delivery audit, flow control, restarts, 2PC
rounds and violations from it, ``jobs`` runs a user's SQL or Python job, and
``replay`` runs one spark-replay (those steps in order, shown through the command's view).
Importing this package does not import pyspark; its modules do.
"""
