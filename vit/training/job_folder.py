"""Sweep job folder names, through a resolver that conf/train.yaml's hydra.sweep.subdir names (registered by
vit.training.resolvers.register_resolvers)."""

from __future__ import annotations

JOB_FOLDER = "vit.job_folder"  # the resolver that conf/train.yaml's hydra.sweep.subdir names job folders with


def job_folder(override_dirname: str) -> str:
    """A sweep job's folder name from Hydra's hydra.job.override_dirname: '/' (in a path value) as %2F and '%' as
    %25, so that the folder never nests, whatever the overrides, and urllib.parse.unquote gives them back."""
    return override_dirname.replace("%", "%25").replace("/", "%2F")
