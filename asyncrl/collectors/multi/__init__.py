"""MultiCollector: a coordinator in the trainer, workers in other processes."""
