"""The one policy for images that cannot be trained on, whatever holds them (a folder's files, a dataset's rows,
a shard's items): without data.skip_bad_images they are an error naming each; with it each is left out with a
warning naming it, and a split with more than data.max_bad_fraction of its images bad is refused."""

from __future__ import annotations

import warnings

from vit.data.errors import DataError

LISTED = 20  # bad images named in one message; the rest are counted


def listing(problems: dict[str, str]) -> str:
    """One indented line per bad image (its name: the reason), the first LISTED of them."""
    lines = [f"  {name}: {reason}" for name, reason in sorted(problems.items())[:LISTED]]
    if len(problems) > LISTED:
        lines.append(f"  ... and {len(problems) - LISTED} more")
    return "\n".join(lines)


def judge(
    problems: dict[str, str], total: int, where: str, skip: bool, max_fraction: float, noun: str = "image"
) -> None:
    """Refuse `problems` (name -> reason, of `total` `noun`s in `where`), or warn that they are left out."""
    if not problems:
        return
    if not skip:
        raise DataError(
            f"{len(problems)} bad {noun}(s) in {where}:\n{listing(problems)}\n"
            f"Remove or replace them, or set data.skip_bad_images=true to leave them out."
        )
    fraction = len(problems) / total
    if fraction > max_fraction:
        raise DataError(
            f"{len(problems)} of the {total} {noun}s in {where} are bad ({fraction:.1%}), more than "
            f"data.max_bad_fraction={max_fraction}:\n{listing(problems)}"
        )
    warnings.warn(
        f"leaving out {len(problems)} bad {noun}(s) of {total} in {where} (data.skip_bad_images=true):\n"
        + "\n".join(f"  {name}: {reason}" for name, reason in sorted(problems.items())),
        stacklevel=3,
    )
