"""The shard writer behind `python -m vit.cli.shards`: a source's splits as LitData shards (vit/data/encoded/stream.py
reads them)."""
