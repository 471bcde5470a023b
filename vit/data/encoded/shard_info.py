"""What a folder of shards holds, read without litdata or Lightning (so that the config can count the classes as it
resolves): OUT/shards.json, written by `python -m vit.cli.shards` beside one LitData optimized folder per split
(OUT/train/, OUT/val/, OUT/test/, each an index.json and its chunk-*.bin shards).

shards.json names the classes, the splits and their image counts, whether an image has several labels
(`multilabel`), the source and the settings the shards were written with; `complete` is false until every split is
written, so that a reader refuses a half-written set.
data.root is a local or shared folder, or an s3:// URL (read with boto3; `storage_options` are boto3 client
arguments, e.g. {endpoint_url: http://minio:9000} for an S3-compatible server).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vit.data.errors import DataError

INFO = "shards.json"
FORMAT = 1  # of shards.json and the items: the writer stamps it, a reader refuses another
SPLITS = ("train", "val", "test")  # one optimized folder each; test may be absent (then val is the test set)
INDEX = "index.json"  # litdata's, in each split's folder
# How litdata is to read our items ({'image': bytes, 'label': int, 'source': str}, vit/data/shards/writer.py), as its
# index.json states it: a folder is read with these and nothing else. Its other formats include 'pickle' (and
# loaders that unpickle), which would run whatever a shared folder or a bucket holds.
ITEM_LOADER, DATA_FORMAT, ITEM_KEYS = "PyTreeLoader", ["bytes", "int", "str"], ["image", "label", "source"]
# shards of several labels an image (shards.json's multilabel): 'label' is their class indices, a 1-D int64 tensor,
# which litdata stores as no_header_tensor (18: its index of int64) and reads with torch.frombuffer, running nothing
MULTILABEL_FORMAT = ["bytes", "no_header_tensor:18", "str"]


def is_url(root: str) -> bool:
    return "://" in root


def location(root: str, *parts: str) -> str:
    """root/parts as a path or a URL."""
    if is_url(root):
        return "/".join([root.rstrip("/"), *parts])
    return str(Path(root).expanduser().joinpath(*parts))


def read_json(root: str, name: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The JSON file root/name, or None where root exists but the file does not; a root that does not exist is
    a FileNotFoundError naming it."""
    if not is_url(root):
        path = Path(root).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"shards not found: data.root={root} does not exist")
        text = (path / name).read_text() if (path / name).is_file() else None
    else:
        text = _read_object(root, name, storage_options or {})
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{location(root, name)} is not JSON ({err})") from None


def _read_object(root: str, name: str, storage_options: dict[str, Any]) -> str | None:
    """An object of an s3:// URL, or None when the bucket holds no such key."""
    bucket, key = _bucket_key(root, name)
    import boto3  # only runs that read shards from an object store pay for it
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        body = boto3.client("s3", **storage_options).get_object(Bucket=bucket, Key=key)["Body"]
        return body.read().decode()
    except (BotoCoreError, ClientError) as err:
        if _s3_code(err) in ("NoSuchKey", "404"):
            return None
        raise _s3_failure(root, bucket, key, err) from None


def object_sizes(root: str, folder: str, storage_options: dict[str, Any] | None = None) -> dict[str, int]:
    """The bytes of each object in root/folder of an s3:// URL, by name: one listing per thousand objects."""
    bucket, prefix = _bucket_key(root, folder)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    sizes = {}
    try:
        listing = boto3.client("s3", **(storage_options or {})).get_paginator("list_objects_v2")
        for page in listing.paginate(Bucket=bucket, Prefix=f"{prefix}/"):
            sizes.update({item["Key"][len(prefix) + 1 :]: item["Size"] for item in page.get("Contents", [])})
    except (BotoCoreError, ClientError) as err:
        raise _s3_failure(root, bucket, prefix, err) from None
    return sizes


def _bucket_key(root: str, name: str) -> tuple[str, str]:
    """The bucket of an s3:// data.root and the key of `name` under it."""
    scheme, _, rest = root.partition("://")
    if scheme != "s3":
        raise DataError(f"data.root={root}: shards are read from a folder or an s3:// URL, not {scheme}://")
    bucket, _, prefix = rest.partition("/")
    return bucket, "/".join(p for p in (prefix.strip("/"), name) if p)


def _s3_code(err: Exception) -> str:
    """S3's error code of a botocore ClientError ('NoSuchKey', ...); '' for botocore's own errors."""
    return getattr(err, "response", {}).get("Error", {}).get("Code", "")


def _s3_failure(root: str, bucket: str, key: str, err: Exception) -> Exception:
    """botocore's error as one line naming data.root and the key; a missing bucket as FileNotFoundError."""
    code = _s3_code(err)
    if code == "NoSuchBucket":
        return FileNotFoundError(f"shards not found: data.root={root} (no bucket '{bucket}')")
    return DataError(f"data.root={root}: cannot read {key} ({code or err.__class__.__name__}: {err})")


def read_info(root: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """shards.json of data.root, checked: finished, with a train split of images and as many classes as named."""
    info = read_json(root, INFO, storage_options)
    where = location(root, INFO)
    if info is None:
        raise DataError(
            f"data.root={root} holds no {INFO}: not shards written by python -m vit.cli.shards SRC OUT "
            f"(data.root is OUT, the folder that holds {INFO} and train/)"
        )
    if not isinstance(info, dict):
        raise DataError(f"{where} holds a JSON {type(info).__name__}, not shards.json's mapping: rewrite the shards")
    missing = [key for key in ("complete", "classes", "num_classes", "splits") if key not in info]
    if missing:
        raise DataError(f"{where} lacks {missing}: rewrite the shards with python -m vit.cli.shards")
    _check_fields(info, where)
    if info.get("format") != FORMAT:
        raise DataError(
            f"{where} holds shards of format {info.get('format')}; this version reads format {FORMAT}: "
            f"rewrite them with python -m vit.cli.shards"
        )
    if not info["complete"]:
        raise DataError(
            f"{where}: the shards are not finished (the write was interrupted); rerun the same "
            f"python -m vit.cli.shards command to finish them"
        )
    if not info["splits"].get("train"):
        raise DataError(f"{where}: the shards hold no training images (splits: {info['splits']})")
    classes = info["classes"]
    if classes is not None and len(classes) != info["num_classes"]:
        raise DataError(f"{where}: {len(classes)} class names for num_classes={info['num_classes']}")
    return info


def _check_fields(info: dict[str, Any], where: str) -> None:
    """shards.json's values of the types the writer writes, each wrong one named with its key."""
    counts = info["splits"]
    expected = {
        "complete": (isinstance(info["complete"], bool), "true or false"),
        "num_classes": (_count(info["num_classes"]) and info["num_classes"] > 0, "a whole number above 0"),
        "classes": (
            info["classes"] is None
            or (isinstance(info["classes"], list) and all(isinstance(c, str) for c in info["classes"])),
            "a list of class names, or null",
        ),
        "splits": (
            isinstance(counts, dict) and all(k in SPLITS and _count(v) for k, v in counts.items()),
            f"a mapping from {', '.join(SPLITS)} to image counts",
        ),
        "bad_images": (isinstance(info.get("bad_images", []), list), "a list of file names"),
        "multilabel": (isinstance(info.get("multilabel", False), bool), "true or false"),
    }
    for key, (right, what) in expected.items():
        if not right:
            raise DataError(f"{where}: {key}={info.get(key)!r} is not {what}; rewrite the shards")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_index(index: Any, where: str, multilabel: bool = False) -> list[dict[str, Any]]:
    """A split's index.json (read from `where`) checked before litdata reads an item: our writer's item format and
    nothing else (see ITEM_LOADER; MULTILABEL_FORMAT for shards of several labels an image), and chunks named by
    plain file names with their sizes; returns the chunks."""
    data_format = MULTILABEL_FORMAT if multilabel else DATA_FORMAT
    named = f"{where}/{INDEX}"
    config = index.get("config") if isinstance(index, dict) else None
    chunks = index.get("chunks") if isinstance(index, dict) else None
    if not isinstance(config, dict) or not isinstance(chunks, list):
        raise DataError(
            f"{named} is not a litdata index (no 'config' mapping and 'chunks' list): write the shards again"
        )
    stated = {key: config.get(key) for key in ("item_loader", "data_format", "encryption", "compression")}
    ours = {"item_loader": ITEM_LOADER, "data_format": data_format, "encryption": None, "compression": None}
    wrong = {key: value for key, value in stated.items() if value != ours[key]}
    if not wrong and _spec_keys(config.get("data_spec")) != ITEM_KEYS:
        wrong = {"data_spec": config.get("data_spec")}
    if wrong:
        raise DataError(
            f"{named} states items of another format ({', '.join(f'{k}={v!r}' for k, v in wrong.items())}): "
            f"shards written by python -m vit.cli.shards hold {ITEM_KEYS} as {data_format}, and no other format is "
            f"read (some run code as they load)"
        )
    for k, chunk in enumerate(chunks):
        name = chunk.get("filename") if isinstance(chunk, dict) else None
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise DataError(f"{named}: chunk {k} has no plain file name (filename={name!r}); write the shards again")
        if not (_count(chunk.get("chunk_size")) and _count(chunk.get("chunk_bytes"))):
            raise DataError(
                f"{named}: chunk {name} states chunk_size={chunk.get('chunk_size')!r} and "
                f"chunk_bytes={chunk.get('chunk_bytes')!r}, not counts; write the shards again"
            )
    return chunks


def _spec_keys(spec: Any) -> list[str] | None:
    """The item keys of litdata's data_spec (torch's pytree spec as JSON: [version, {type, context, ...}]), or None
    where it states anything but a dict of leaves."""
    try:
        _, node = json.loads(spec)
        leaves = all(child.get("type") is None and not child.get("children_spec") for child in node["children_spec"])
        return json.loads(node["context"]) if node["type"] == "builtins.dict" and leaves else None
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def count_classes(root: str, storage_options: dict[str, Any] | None = None) -> int:
    """The number of classes of the shards at data.root: data.num_classes and the model's follow it."""
    return int(read_info(root, storage_options)["num_classes"])
