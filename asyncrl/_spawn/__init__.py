"""Process plumbing: starting, watching and stopping child processes, their threads and logs."""
