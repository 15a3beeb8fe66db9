"""The read path: run folders and other tools' logs → DuckDB views (``RunSet``), read as they grow."""
