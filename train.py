"""Train a ViT classifier. Training (Lightning module, data, Hydra configs) is being built in issue #3."""

import sys

import vit


def main() -> int:
    print(
        f"vit {vit.__name__} is installed with {len(vit.list_presets())} model presets "
        f"({', '.join(vit.list_presets())}), but training is not implemented yet (issue #3). "
        "Run `make test` to see the model proven against timm and the equations.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
