"""The command lines: python -m vit.cli.predict | export | visualize | sweep. The top floor."""
