"""``gpudays``: parsing, command flow, errors and exit codes."""
