"""`HistorySink` backends: memory, sqlite and postgres (the store's own tables), S3 (partitioned
NDJSON objects) and Kinesis Firehose, and the buffering that keeps history off the hot path."""
