"""Figures of what a ViT learned, drawn from a checkpoint:

    python -m vit.cli.visualize pos-embed --checkpoint CKPT --out FILE.png
    python -m vit.cli.visualize attention --checkpoint CKPT --image IMG --out FILE.png [--layer L]
    python -m vit.cli.visualize attention-distance --checkpoint CKPT --data NAME [--data-root DIR] --out FILE.png
    python -m vit.cli.visualize resample --checkpoint CKPT --img-size PIXELS --out FILE.png
    python -m vit.cli.visualize confusion --checkpoint CKPT --out FILE.png [data=NAME data.KEY=VALUE ...]
    python -m vit.cli.visualize mae --checkpoint CKPT [--image IMG | --image-index N] --out FILE.png [data=...]

The figures are vit/figures/drawing.py's and confusion.py's; checkpoints are read by vit.checkpoint.load (every
command also takes --preset NAME, which timm and JAX files need: e.g. the position table of a timm ViT-B/16 with
--preset vit_base_16).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix, MultilabelAveragePrecision

from vit.atomic import write_atomically
from vit.cli.checkpoint_args import add_checkpoint_arguments, load_checkpoint
from vit.cli.output import write_out
from vit.cli.predict import positive, predict, read_image
from vit.cli.run_data import evaluation_data
from vit.figures import analysis
from vit.figures.confusion import average_precision_figure, confusion_figure
from vit.figures.drawing import (
    DPI,
    attention_distance_figure,
    attention_figure,
    denormalized,
    pos_embed_figure,
    reconstruction_figure,
    resample_figure,
)
from vit.interop.load import Loaded
from vit.model import ConfigError, VisionTransformer
from vit.model.presets import conf_dir
from vit.model.size import check_fits, check_memory
from vit.training.checks import DATA_FAULTS, data_fault
from vit.training.registry import register


def _pixels(size: tuple[int, int]) -> str:
    return f"{size[0]}" if size[0] == size[1] else f"{size[0]}x{size[1]}"


def _describe(model: VisionTransformer) -> str:
    c = model.config
    return f"pos_embed={c.pos_embed}, {_pixels(c.img_size)} px, patch {_pixels(c.patch_size)}, pool={c.pool}"


def _table(loaded: Loaded) -> Tensor:
    table = analysis.position_table(loaded.model)
    if table is None:
        raise SystemExit(f"{loaded.path}: the model has no position embedding (pos_embed='none'): nothing to draw")
    return table


def _pos_embed(args: argparse.Namespace) -> Figure:
    loaded = load_checkpoint(args)
    table = _table(loaded)
    rotary = analysis.table_name(loaded.model) == "rotary phases"
    note = " (rotary phases: the relative-position factor of q.k)" if rotary else ""
    return pos_embed_figure(table, f"{Path(args.checkpoint).name}: {_describe(loaded.model)}{note}")


def _attention(args: argparse.Namespace) -> Figure:
    loaded = load_checkpoint(args)
    image = read_image(args.image)
    images = loaded.preprocess(image)  # (1, C, H, W)
    attentions = loaded.model.attention_maps(images)
    depth = len(attentions)
    if not -depth <= args.layer < depth:
        raise SystemExit(f"--layer {args.layer}: the model has layers 0..{depth - 1} (or -1 for the last)")
    layer = args.layer % depth
    # the image's own grid: a model.naflex checkpoint reads it at its aspect ratio
    grid = tuple(size // patch for size, patch in zip(images.shape[-2:], loaded.config.patch_size, strict=True))
    heads = analysis.patch_attention(attentions[layer], loaded.model, grid)[0]
    rolled = analysis.rollout_patches(attentions, loaded.model, grid)[0]
    query = "class token" if loaded.config.pool == "token" else "mean over patch queries"
    title = f"{Path(args.image).name}: layer {layer} attention ({query})"
    if loaded.config.num_classes:  # a model without a head outputs features: a softmax over them predicts nothing
        ((label, probability),) = predict(loaded, image, top_k=1)
        title += f"; predicted {label} ({probability:.0%})"
    return attention_figure(denormalized(images, loaded.mean, loaded.std), heads, rolled, title)


def eval_images(name: str, root: str | None, count: int, loaded: Loaded) -> Tensor:
    """The first `count` test images of a data config (conf/data/NAME.yaml), preprocessed as in training."""
    path = conf_dir() / "data" / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ValueError(f"data config {name!r}: no {path}; choose one of {', '.join(names)}")
    height, width = loaded.input_size or loaded.config.img_size  # an imported image processor's crop, if it has one
    if height != width:
        raise ValueError(f"the model reads {height}x{width} images; the data modules make square ones")
    data_cfg = OmegaConf.load(path)
    data_cfg.eval_batch_size = count
    data_cfg.img_size = height  # the model's input size, as evaluation fed it: the attention maps are on its grid
    if root is not None:
        data_cfg.root = root
    register()  # the data configs read their class counts through its resolvers
    if OmegaConf.is_missing(data_cfg, "root"):
        raise ValueError(f"data config {name!r} has no root folder of its own: give --data-root")
    try:
        datamodule = instantiate(data_cfg)
        datamodule.prepare_data()
        datamodule.setup("test")
    except DATA_FAULTS as err:
        raise ValueError(str(err)) from None
    except (InstantiationException, OmegaConfBaseException) as err:  # the data's own line is behind Hydra's
        raise ValueError(str(data_fault(err) or err.__cause__ or err).splitlines()[0]) from None
    images, _ = datamodule.on_after_batch_transfer(next(iter(datamodule.test_dataloader())), 0)
    if images.shape[1] != loaded.config.in_chans:
        channels = loaded.config.in_chans
        raise ValueError(f"data config {name!r} has {images.shape[1]} channels; the model reads {channels}")
    return images


def _attention_distance(args: argparse.Namespace) -> Figure:
    loaded = load_checkpoint(args)
    images = eval_images(args.data, args.data_root, args.num_images, loaded)
    c = loaded.config
    tokens = c.num_prefix_tokens + c.grid_size[0] * c.grid_size[1]
    try:  # every layer's maps at once, L x (B, H, T, T): 256 images of a ViT-L/16 need 15 GB
        check_fits(4 * c.depth * len(images) * c.num_heads * tokens**2, f"{len(images)} images' attention maps")
    except ConfigError as err:
        raise SystemExit(f"--num-images {args.num_images}: {err}; give fewer") from None
    distances = analysis.mean_attention_distance(loaded.model.attention_maps(images), loaded.model)
    title = f"{Path(args.checkpoint).name} on {len(images)} {args.data} test images: {_describe(loaded.model)}"
    return attention_distance_figure(distances, title)


def _resample(args: argparse.Namespace) -> Figure:
    loaded = load_checkpoint(args)
    c = loaded.config
    size = (args.img_size * 2)[:2]  # (height, width)
    if len(args.img_size) > 2 or min(size) <= 0 or size[0] % c.patch_size[0] or size[1] % c.patch_size[1]:
        raise SystemExit(f"--img-size {args.img_size}: give H or H W, whole numbers of {_pixels(c.patch_size)} patches")
    try:  # the table on the new grid: --img-size 1000000 asks for terabytes
        check_memory(replace(c, img_size=size))
    except ConfigError as err:
        raise SystemExit(f"--img-size {' '.join(map(str, args.img_size))}: {err}") from None
    before = _table(loaded)
    after = analysis.position_table(loaded.model, (size[0] // c.patch_size[0], size[1] // c.patch_size[1]))
    name = analysis.table_name(loaded.model)
    how = {"learned table": "resampled bicubically", "rotary phases": "recomputed"}.get(name, "recomputed (fixed)")
    title = f"{name}, {_pixels(c.img_size)} px -> {_pixels(size)} px: {how}"
    return resample_figure(before, after, title)


def _confusion(args: argparse.Namespace) -> Figure:
    loaded = load_checkpoint(args)
    classes, several = loaded.config.num_classes, loaded.multilabel
    if not classes:
        raise ValueError(f"{args.checkpoint}: a model without a head (num_classes=0) puts images in no class")
    data = evaluation_data(args.checkpoint, args.overrides, loaded)
    # counts grow batch by batch; average precision keeps every score, as ranking them needs
    measure = MultilabelAveragePrecision(classes, average=None) if several else MulticlassConfusionMatrix(classes)
    loaded.model.eval()
    with torch.inference_mode():
        for batch in data.test_dataloader():
            images, labels = data.on_after_batch_transfer(batch, 0)
            if (labels.dim() == 2) != several:
                model, data_has = ("several labels", "one") if several else ("one label", "several")
                raise ValueError(
                    f"{args.checkpoint} answers {model} per image, but the data gives {data_has} per image"
                )
            scores = loaded.logits(images)  # (B, K), averaged over the run's test-time views as its test was
            measure.update(scores.sigmoid() if several else scores.argmax(-1), labels.int() if several else labels)
    names = loaded.classes or data.facts()["classes"]
    what = f"{Path(args.checkpoint).name} on the test split of {type(data).__name__}"
    if several:
        return average_precision_figure(measure.compute(), names, f"{what}: average precision of each class")
    counts = measure.compute()  # (K, K): rows the true class, columns the predicted one
    accuracy = float(counts.trace() / counts.sum())
    return confusion_figure(counts, names, f"{what} ({int(counts.sum())} images, accuracy {accuracy:.2%})")


def _mae(args: argparse.Namespace) -> Figure:
    loaded = load_checkpoint(args)
    if loaded.task != "mae":
        raise ValueError(f"{args.checkpoint}: not a task=mae run's checkpoint (task={loaded.task}): no decoder to draw")
    from vit.training.module import ViTClassifier  # Lightning's, for this command alone

    module = ViTClassifier.load_from_checkpoint(args.checkpoint, weights_only=True).eval()  # the decoder too
    if args.image is not None:
        images, name = loaded.preprocess(read_image(args.image)), Path(args.image).name  # (1, C, H, W)
    else:
        data = evaluation_data(args.checkpoint, args.overrides, loaded)
        count = len(data.test_set)
        if not 0 <= args.image_index < count:
            raise ValueError(f"--image-index {args.image_index}: the test split holds images 0..{count - 1}")
        seen = 0
        for batch in data.test_dataloader():  # read as the run's test read it, up to the batch holding the image
            images, _ = data.on_after_batch_transfer(batch, 0)
            if args.image_index < seen + len(images):
                images = images[args.image_index - seen :][:1]
                break
            seen += len(images)
        name = f"test image {args.image_index}"
    masked, reconstructed, pasted = module.task.panels(module, images)
    shown = [denormalized(x, loaded.mean, loaded.std) for x in (images, masked, reconstructed, pasted)]
    names = ["original", f"masked ({module.task.mask_ratio:.0%})", "reconstruction", "reconstruction + visible"]
    return reconstruction_figure(list(zip(names, shown, strict=True)), f"{Path(args.checkpoint).name}: {name}")


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(  # the docstring whole: its first paragraph ends in a colon before the commands
        prog="python -m vit.cli.visualize", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, draw, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        add_checkpoint_arguments(sub)
        sub.add_argument(
            "--out", required=True, type=Path, help="the figure to write: PNG, or as its suffix says (.pdf, .svg, ...)"
        )
        sub.set_defaults(draw=draw)
        return sub

    command(
        "pos-embed",
        _pos_embed,
        "Cosine similarity of every patch position's embedding with every other, laid out like the patch "
        "grid (Dosovitskiy et al. 2021, Fig. 7), with the table's first 3 principal components as RGB and its "
        "mean similarity against distance. For rope2d: the rotary phases' relative-position similarity.",
    )
    attention = command(
        "attention",
        _attention,
        "One image with each head's attention over the patches at one layer (the class token's for pool=token; "
        "else the mean over patch queries, which is not what attention pooling's query or token_avg's class "
        "token reads) and the attention rollout across all layers.",
    )
    attention.add_argument("--image", required=True, type=Path, help="any image file PIL reads")
    attention.add_argument("--layer", type=int, default=-1, help="layer index, from 0; -1 (default) the last")
    distance = command(
        "attention-distance",
        _attention_distance,
        "Mean attention distance of every head against depth (Dosovitskiy et al. 2021, Fig. 7 right), "
        "averaged over test images of a dataset.",
    )
    distance.add_argument("--data", required=True, help="a data config name from conf/data, e.g. fashion_mnist")
    distance.add_argument("--data-root", help="overrides the data config's root folder")
    distance.add_argument("--num-images", type=positive, default=256, help="test images to average over (256)")
    resample = command(
        "resample",
        _resample,
        "The position table before and after moving to another resolution (as fine-tuning does): "
        "learned tables are resampled bicubically, fixed ones recomputed.",
    )
    resample.add_argument("--img-size", required=True, type=int, nargs="+", help="the new size in pixels: H or H W")
    confusion = command(
        "confusion",
        _confusion,
        "The confusion matrix of the run's test split (rows the true class, columns the predicted one, each row's "
        "counts as shares of that class's images), scored as the run's test scored it; for a model of several labels "
        "per image, each class's average precision instead. The data is the run folder's config.yaml's, beside "
        "the checkpoint, or the data=NAME and data.KEY=VALUE overrides given after the options.",
    )
    confusion.add_argument(
        "overrides", nargs="*", help="train.py's data overrides, e.g. data=imagefolder data.root=DIR"
    )
    mae = command(
        "mae",
        _mae,
        "A masked autoencoder's reconstruction of one image (He et al. 2022, Fig. 2): the image, its masked patches, "
        "the reconstruction and the reconstruction with the visible patches pasted back. The image is a file "
        "(--image) or one of the run's test split (--image-index, 0 by default; data=NAME and data.KEY=VALUE after "
        "the options read other data).",
    )
    which = mae.add_mutually_exclusive_group()
    which.add_argument("--image", type=Path, help="any image file PIL reads")
    which.add_argument("--image-index", type=int, default=0, help="the test split's image of this index (0)")
    mae.add_argument("overrides", nargs="*", help="train.py's data overrides, e.g. data=images data.root=DIR")
    return main


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    # named, so that matplotlib writes the very path given: it would add ".png" to a name without a suffix
    form = args.out.suffix.removeprefix(".").lower() or "png"
    known = FigureCanvasBase.get_supported_filetypes()
    if form not in known:
        raise SystemExit(
            f"--out {args.out}: matplotlib cannot write {form!r} files; name one of: {', '.join(sorted(known))}"
        )

    def draw_and_write() -> None:  # CheckpointError is a ValueError: bad input, said in one line
        figure = args.draw(args)
        write_atomically(args.out, lambda path: figure.savefig(path, format=form, dpi=DPI))

    write_out(args.out, draw_and_write)


if __name__ == "__main__":
    sys.exit(main())
