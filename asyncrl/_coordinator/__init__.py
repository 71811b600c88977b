"""The trainer side of a multi-process run: the coordinator, its rules, its checks and registry."""
