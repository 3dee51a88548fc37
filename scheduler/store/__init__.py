"""`JobStore` backends: memory (reference), sqlite (embedded default); postgres and dynamodb at scale."""
