"""Checkpoint formats, ours and other libraries' (one file per source), and the one loader: vit.interop.load."""
