"""Central inference: the batched policy loop, its dedicated process, the env steppers."""
