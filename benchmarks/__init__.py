"""Benchmarks against timm (speed, time to accuracy) and of the data paths, run from the repository root:
python -m benchmarks.throughput (… .time_to_accuracy, … .data, … .step_pieces). Each prints a markdown table
and, with --json PATH, writes its measurements and the machine's facts; the recorded figures are in
benchmarks/RESULTS.md."""
