"""The command lines: python -m vit.cli.predict | export | visualize | probe | sweep | shards | consolidate. The top
floor."""
