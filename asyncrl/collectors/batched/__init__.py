"""AsyncBatchedCollector: env worker processes, one batched policy (central inference)."""
