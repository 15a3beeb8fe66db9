"""The write path: a trainer's tensors and metrics dicts → rows in Parquet files (``Monitor``)."""
