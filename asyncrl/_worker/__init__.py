"""What runs in a worker process or on a worker host: the worker, its spec, host and relay."""
