"""`TimeIndex` backends: memory, sqlite (a view of the store's runs table); redis at scale."""
