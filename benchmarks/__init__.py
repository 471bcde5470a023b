"""Benchmarks of issue #6, run from the repository root: python -m benchmarks.throughput (… .time_to_accuracy,
… .data). Each prints a markdown table and, with --json PATH, writes its measurements and the machine's facts."""
