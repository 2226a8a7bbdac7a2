"""Export of replication logs to Parquet and the Spark consistency audit."""
