"""The PySpark writer (for DataFrame.foreachPartition) and reader. Arrives with the Spark issue."""
