"""Pretrained weights by name, as people write them, resolved to the files vit.checkpoint.load reads:

- `hf-hub:ORG/REPO` (timm's spelling, for timm, Hugging Face transformers and OpenCLIP repos alike), `@REVISION`
  pinning a branch, tag or commit. Files come through huggingface_hub: its cache (HF_HOME, HF_HUB_CACHE), its
  offline mode (HF_HUB_OFFLINE), its token and its progress bars. Only what the loader reads is fetched: the
  repo's configs, then its weights, safetensors where the repo has them (a pickled .bin is read weights-only).
  One request first asks whether the hub answers (within HF_HUB_ETAG_TIMEOUT): where it does not, the files are
  read from the cache alone, at once, as offline; huggingface_hub would retry for each file the cache lacks (the
  configs the repo does not have among them), most of a minute. Names and the cache's refs are checked first: a
  name that is not ORG/REPO or a revision that climbs out of the cache (`..`) is refused, and so is a ref file
  that does not hold a commit hash, which huggingface_hub would follow as a path.
- `torchvision:ARCH` or `torchvision:ARCH.WEIGHTS` (e.g. `torchvision:vit_b_16.IMAGENET1K_SWAG_E2E_V1`; ARCH alone
  is its DEFAULT weights): torchvision's weights API, downloaded into torch.hub's cache (TORCH_HOME).

A local path that exists always wins over a name. What was resolved (repo, commit, files; or the weights and their
URL) is returned beside the path, so that a run records exactly which weights it started from.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vit.interop.files import CheckpointError

HF_HUB, TORCHVISION = "hf-hub:", "torchvision:"
# what the loader reads from a hub folder (vit/interop/load.py), in the order it tells the formats apart: OpenCLIP's
# config, else config.json (timm's or transformers'); then each one's weights, safetensors first
CONFIGS = {
    "open_clip_config.json": ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"),
    "config.json": ("model.safetensors", "pytorch_model.bin"),
}
OPTIONAL = ("preprocessor_config.json",)  # transformers' normalisation, beside its config.json
# what git refuses in a ref name (git check-ref-format), a revision being a branch, a tag or a commit
_NOT_IN_A_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{")


@dataclass(frozen=True)
class Resolved:
    """A checkpoint's path, and where it came from when it was named (None for a local path)."""

    path: Path
    source: dict[str, Any] | None = field(default=None)


def is_hub_name(name: str | Path) -> bool:
    """Whether `name` is written as a hub name (whether or not a local path of that name exists)."""
    return str(name).startswith((HF_HUB, TORCHVISION))


def resolve(name: str | Path) -> Resolved:
    """A local path as it is, or the cached (downloaded where needed) files of a hub name; CheckpointError naming
    the name where it cannot be had."""
    if Path(name).exists() or not is_hub_name(name):
        return Resolved(Path(name))
    text = str(name)
    if text.startswith(HF_HUB):
        return _from_hugging_face_hub(text)
    return _from_torchvision(text)


def _from_hugging_face_hub(name: str) -> Resolved:
    repo, _, revision = name.removeprefix(HF_HUB).partition("@")
    _check_name(name, repo, revision)
    _cached_repo(repo, revision or None)  # a ref that is no commit hash: refused before huggingface_hub follows it
    local = not _hub_answers(repo, revision or None, next(iter(CONFIGS)))
    fetched: list[Path] = []
    for config, weights in CONFIGS.items():
        path = _fetch(name, repo, revision or None, config, local)
        if path is None:
            continue
        fetched.append(path)
        found = next(
            (p for p in (_fetch(name, repo, revision or None, w, local) for w in weights) if p is not None), None
        )
        if found is None:
            raise CheckpointError(f"{name}: the repo has {config} but none of {', '.join(weights)} beside it")
        fetched.append(found)
        if config == "config.json":
            fetched += [p for p in (_fetch(name, repo, revision or None, f, local) for f in OPTIONAL) if p is not None]
        folder = found.parent  # huggingface_hub's snapshot folder: snapshots/<commit>/
        source = {"name": name, "repo": repo, "revision": folder.name, "files": sorted(p.name for p in fetched)}
        return Resolved(folder, source)
    raise CheckpointError(
        f"{name}: the repo has neither {' nor '.join(CONFIGS)}" + _where_cached(repo, revision or None)
    )


def _check_name(name: str, repo: str, revision: str) -> None:
    """Refuse a repo that is not ORG/REPO as the hub spells it (huggingface_hub's own rule, which it would raise as a
    traceback) and a revision git would refuse: both become paths in the cache, and `..` would climb out of it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if repo.count("/") != 1:
        raise CheckpointError(f"{name}: a Hugging Face name is hf-hub:ORG/REPO (or hf-hub:ORG/REPO@REVISION)")
    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise CheckpointError(f"{name}: not a Hugging Face repo name ({str(err).splitlines()[0]})") from None
    if revision and (_NOT_IN_A_REF.search(revision) or {"", "."} & set(revision.split("/"))):
        raise CheckpointError(f"{name}: {revision!r} is not a branch, tag or commit name")


def _hub_answers(repo: str, revision: str | None, filename: str) -> bool:
    """Whether the hub answers one request (its answer aside: a missing file or a gated repo is an answer), within
    huggingface_hub's HF_HUB_ETAG_TIMEOUT and without its retries; False offline (HF_HUB_OFFLINE)."""
    import httpx2
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision), timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except (httpx2.TransportError, OfflineModeIsEnabled):  # no connection, a timeout, a proxy that refuses
        return False
    except HfHubHTTPError:  # an answer: no such file, a gated or private repo (the fetches say which)
        pass
    return True


def _fetch(name: str, repo: str, revision: str | None, filename: str, local: bool = False) -> Path | None:
    """One file of the repo through huggingface_hub (from its cache, or downloaded into it; from the cache alone
    where `local`); None where the repo has no such file (or, offline, the cache holds none)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(hf_hub_download(repo, filename, revision=revision, local_files_only=local))
    except GatedRepoError:
        raise CheckpointError(
            f"{name}: a gated repo: accept its terms on the Hugging Face Hub, then log in (hf auth login)"
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{name}: no such repo on the Hugging Face Hub (or a private one: log in with hf auth login)"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{name}: the repo has no revision {revision}") from None
    except LocalEntryNotFoundError:  # offline, or the hub unreachable: the cache answers alone
        if _cached_repo(repo, revision) is None:
            raise CheckpointError(f"{name}: not in the Hugging Face cache" + _where_cached(repo, revision)) from None
        return None
    except EntryNotFoundError:  # (after its subclass above) the repo has no such file
        return None
    except HfHubHTTPError as err:
        raise CheckpointError(f"{name}: the Hugging Face Hub answered {str(err).splitlines()[0]}") from None


def _cached_repo(repo: str, revision: str | None) -> Path | None:
    """The cache's snapshot folder of the repo at `revision` (a branch, tag or commit; main when None), if any;
    CheckpointError naming a ref file that holds anything but a commit hash (`../..` would leave the cache)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import REGEX_COMMIT_HASH

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    ref = folder / "refs" / (revision or "main")
    commit = ref.read_text(errors="replace").strip() if ref.is_file() else revision
    if ref.is_file() and not REGEX_COMMIT_HASH.fullmatch(commit):
        raise CheckpointError(f"{ref}: a ref of the Hugging Face cache holds {commit[:60]!r}, not a commit hash")
    snapshot = folder / "snapshots" / commit if commit else None
    return snapshot if snapshot is not None and snapshot.is_dir() else None


def _where_cached(repo: str, revision: str | None) -> str:
    """The end of a message about a repo the cache lacks: where the cache is and why the hub was not asked."""
    from huggingface_hub import constants

    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hugging Face Hub could not be reached"
    at = f" at {revision}" if revision else ""
    return f" (cache: {constants.HF_HUB_CACHE}; {why}): download {repo}{at} once where the hub can be reached"


def _from_torchvision(name: str) -> Resolved:
    import torch
    import torchvision

    arch, _, weights_name = name.removeprefix(TORCHVISION).partition(".")
    if not arch.startswith("vit_"):
        raise CheckpointError(f"{name}: torchvision's ViTs are vit_b_16, vit_b_32, vit_l_16, vit_l_32 and vit_h_14")
    try:
        enum = torchvision.models.get_model_weights(arch)
    except ValueError:
        raise CheckpointError(f"{name}: torchvision has no model {arch}") from None
    try:
        weights = enum[weights_name or "DEFAULT"]
    except KeyError:
        known = ", ".join(k for k in enum.__members__ if k != "DEFAULT")
        raise CheckpointError(f"{name}: torchvision's {arch} has no weights {weights_name} (it has {known})") from None
    path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(weights.url).path)
    if not path.is_file():
        try:  # torchvision's own download into torch.hub's cache, its hash checked
            weights.get_state_dict(progress=True, check_hash=True)
        except OSError as err:  # urllib's URLError among them
            raise CheckpointError(
                f"{name}: not in torch.hub's cache ({path.parent}) and {weights.url} could not be downloaded "
                f"({err.__class__.__name__}: {err})"
            ) from None
    transforms = weights.transforms()
    source = {
        "name": name,
        "weights": str(weights),
        "url": weights.url,
        "file": path.name,
        # how the weights read images: torchvision's evaluation transform, resize the short side, then crop
        "crop_pct": transforms.crop_size[0] / transforms.resize_size[0],
        "interpolation": transforms.interpolation.value,
        "mean": list(transforms.mean),
        "std": list(transforms.std),
        "classes": list(weights.meta.get("categories") or []) or None,
    }
    return Resolved(path, source)
