"""Exit codes of every ``settle`` command, the companion parts' included (docs/cli.md)."""

EXIT_OK = 0
EXIT_FAILED = 1
"""Not found, or the demo saw a duplicate downstream effect / a failed check."""
EXIT_USAGE = 2
"""Bad arguments or options (click's own code for usage errors)."""
EXIT_UNAVAILABLE = 3
"""Redis unreachable, or the namespace missing or configured differently (shard count)."""
EXIT_INTERRUPTED = 130
