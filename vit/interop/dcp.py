"""A sharded checkpoint's torch.distributed.checkpoint (DCP) files, `.metadata` and the shards
`__<rank>_<n>.distcp`, read so that nothing in them runs and a damaged folder is one line naming its file.

DCP's own FileSystemReader unpickles `.metadata` with plain pickle, and its load planners read the shards'
non-tensor items (the optimizer's settings) with torch.load(weights_only=False): a folder someone hands us could
run code either way. Here `.metadata` is unpickled allowing only the classes DCP's writer puts there, and every
non-tensor item is read weights_only; the folder is checked whole (its files present, long enough, its items
readable) before DCP starts, so that a damaged one is refused before any process waits on another."""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from vit.interop.files import CheckpointError
from vit.interop.sharded import DCP_METADATA

_DCP = "torch.distributed.checkpoint"
# what DCP's writer pickles into .metadata, listed from folders it wrote: its dataclasses and the enum of memory
# formats, the storage records of its file writer, tensor sizes and layouts, the folder's path; dtypes besides
_ALLOWED = {
    *((f"{_DCP}.metadata", name) for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}  # fmt: skip


class _Refused(pickle.UnpicklingError):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata and nothing else: any other global (a function to call) is refused unresolved."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) not in _ALLOWED:
            raise _Refused(f"{module}.{name}")
        return super().find_class(module, name)


def read_metadata(folder: Path) -> Metadata:
    """The folder's `.metadata`, its records checked: each item stored, in a shard of this folder."""
    path = folder / DCP_METADATA
    try:
        with path.open("rb") as file:
            metadata = _MetadataUnpickler(file).load()
    except _Refused as err:
        raise CheckpointError(
            f"{path}: refused: it pickles {err.name}, not only DCP's metadata, and that could run code when loaded"
        ) from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read: {err.strerror or err}") from None
    except Exception:  # whatever pickle raises on bytes that are not a pickle: several kinds, none meaningful
        raise CheckpointError(f"{path}: not DCP's metadata (empty, truncated, corrupt or another file)") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path}: holds a {type(metadata).__name__}, not DCP's metadata")
    try:
        _check_records(metadata)
    except (AttributeError, TypeError) as err:  # the right classes, holding the wrong things
        raise CheckpointError(f"{path}: not DCP's metadata of files ({err})") from None
    except LookupError as err:
        raise CheckpointError(f"{path}: no shard holds {err.args[0]}") from None
    return metadata


def _check_records(metadata: Metadata) -> None:
    """Each item's record (file, offset, length) present: a TypeError or AttributeError where one is malformed, a
    LookupError naming an item without one."""
    for info in metadata.storage_data.values():
        if not (isinstance(info.relative_path, str) and info.offset >= 0 and info.length >= 0):
            raise TypeError(f"{info!r} is no file, offset and length")
    for name, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            keys = [MetadataIndex(name, chunk.offsets) for chunk in item.chunks]
        elif isinstance(item, BytesStorageMetadata):
            keys = [MetadataIndex(name)]
        else:
            raise TypeError(f"{name} is a {type(item).__name__}, neither tensor nor bytes")
        if any(key not in metadata.storage_data for key in keys):
            raise LookupError(name)


def check(folder: Path) -> Metadata:
    """Refuse, naming the file, a folder DCP would fail on or that would run code: `.metadata` unreadable or
    pickling anything but DCP's records, a shard missing (a rank's file not copied), cut short or named outside
    the folder, a non-tensor item that is not plain data. Returns the metadata."""
    metadata = read_metadata(folder)
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        if Path(info.relative_path).name != info.relative_path or info.relative_path in ("", ".", ".."):
            raise CheckpointError(
                f"{folder / DCP_METADATA}: names the shard {info.relative_path!r}, not a file beside it"
            )
        if info.transform_descriptors:  # compression and the like: our writer never sets them, this reader skips them
            transforms = info.transform_descriptors
            raise CheckpointError(f"{folder / info.relative_path}: its items are stored transformed ({transforms!r})")
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        shard = folder / name
        if not shard.is_file():
            raise CheckpointError(f"{shard}: missing: every rank's shard must be in the folder")
        if (size := shard.stat().st_size) < end:
            raise CheckpointError(f"{shard}: truncated: {size:,} bytes, its items end at byte {end:,}")
    for name, item in metadata.state_dict_metadata.items():
        if isinstance(item, BytesStorageMetadata):
            info = metadata.storage_data[MetadataIndex(name)]
            with (folder / info.relative_path).open("rb") as file:
                file.seek(info.offset)
                read_item(file.read(info.length), folder / info.relative_path, name)
    return metadata


def read_item(data: bytes, shard: Path, name: str) -> Any:
    """A shard's non-tensor item (a number, a string, a tuple of them...), read weights_only."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if unsafe := re.search(r"GLOBAL (\S+)", str(err)):  # weights_only refused a global: it would run code
            raise CheckpointError(
                f"{shard}: refused: its item {name} pickles {unsafe[1]}, not only plain data, and that could run "
                "code when loaded"
            ) from None
        raise CheckpointError(f"{shard}: its item {name} is not readable (corrupt)") from None
    except Exception:  # torch.load's many errors on bytes that are not its format
        raise CheckpointError(f"{shard}: its item {name} is not readable (corrupt)") from None


class SafeReader(FileSystemReader):
    """DCP's reader of a folder `check`ed first: the metadata it read, and the non-tensor items read weights_only
    (then saved again, plain, for the planner, which unpickles them as it likes)."""

    def __init__(self, folder: Path):
        super().__init__(folder)
        self.metadata = check(folder)

    def read_metadata(self) -> Metadata:  # without **kwargs: DCP then never falls back to per-rank metadata files
        return self.metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        return super().read_data(plan, _PlainBytes(planner, self))


class _PlainBytes:
    """The planner, given each non-tensor item as read weights_only and saved again: only plain data."""

    def __init__(self, planner: LoadPlanner, reader: SafeReader):
        self._planner, self._reader = planner, reader

    def load_bytes(self, item: ReadItem, value: io.BytesIO) -> None:
        shard = Path(self._reader.path) / self._reader.storage_data[item.storage_index].relative_path
        plain = io.BytesIO()
        torch.save(read_item(value.read(), shard, item.dest_index.fqn), plain)
        plain.seek(0)
        self._planner.load_bytes(item, plain)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


@contextmanager
def reading(folder: Path) -> Iterator[None]:
    """DCP's CheckpointException (a BaseException that carries each rank's traceback) as one line naming the
    folder; ours, raised inside DCP, as itself; an interrupt or exit that DCP caught as what it was."""
    try:
        yield
    except CheckpointException as err:
        causes = [cause for cause, _ in err.failures.values()]
        if stop := next((c for c in causes if not isinstance(c, Exception)), None):
            raise stop from None
        if ours := next((c for c in causes if isinstance(c, CheckpointError)), None):
            raise CheckpointError(str(ours)) from None
        first = causes[0] if causes else err
        reason = (str(first).strip().splitlines() or [type(first).__name__])[0]
        if isinstance(first, pickle.UnpicklingError):  # DCP reads tensors weights_only; its advice does not apply
            unsafe = re.search(r"GLOBAL (\S+)", str(first))
            reason = f"a tensor's record pickles {unsafe[1]}: refused" if unsafe else "a tensor's record is corrupt"
        raise CheckpointError(f"{folder}: its shards cannot be read ({type(first).__name__}: {reason})") from None
