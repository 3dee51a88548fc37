"""`HistorySink` backends: memory, sqlite (the store's own table), and a buffering wrapper."""
