"""The docs hold the project as it is (STYLE.md, habit 14): benchmarks/RESULTS.md today's figures only, and no tracked
text of the package, the docs or the benchmarks speaks of how the project was built: no work sessions, no issue
numbers (history is git log)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
RESULTS_MAX_LINES = 250
SCOPE = ["vit", "docs", "benchmarks", "README.md"]
# "session"; an issue number: "issue #22", "issues 6 and 18", or a bare "#22" (not an HTML entity "&#8212;", an
# anchor "#L22" or a six-digit colour)
# a session as a word, not inside a library's identifier (wandb's authenticate_session)
DIARY = re.compile(r"\bsessions?\b|\bissues?\s+#?\d+|(?<![\w&#/])#\d{1,4}\b", re.IGNORECASE)


def tracked_texts() -> list[tuple[str, str]]:
    """(path, text) of every tracked text file in SCOPE, as the working tree has it; images are left out."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", *SCOPE], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing is tracked")
    texts = []
    for name in filter(None, listed.stdout.decode().split("\0")):
        path = ROOT / name
        if not path.is_file():  # deleted in the working tree, not yet in the index
            continue
        try:
            texts.append((name, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:  # a figure
            continue
    return texts


def test_results_hold_today_s_figures_only():
    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= RESULTS_MAX_LINES, (
        f"benchmarks/RESULTS.md has {len(lines)} lines, over {RESULTS_MAX_LINES}: replace the rows a new measurement "
        "supersedes instead of adding a section (older figures live in git history, what a change bought in NOTES.md)"
    )


def test_the_project_speaks_of_itself_not_of_how_it_was_built():
    found = [
        f"{name}:{number}: {line.strip()}"
        for name, text in tracked_texts()
        for number, line in enumerate(text.splitlines(), 1)
        if DIARY.search(line)
    ]
    assert not found, "a work session or an issue number in tracked text (say the reason instead):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line, diary",
    [
        ("A 128-wide threshold stood until the eleventh session", True),
        ("wbauth.authenticate_session(prompt=False, update_session=False)", False),
        ("Benchmarks of issue #6, run from the repository root", True),
        ("the families (issues 18 and 22)", True),
        ("RESULTS: the default run in 62 s (#22)", True),
        ("see benchmarks/NOTES.md change 20", False),
        ("an em dash &#8212; and an anchor docs/model.md#L22", False),
        ('color="#1f77b4"', False),
        ("x = y  # 2 heads", False),
    ],
)
def test_diary_pattern(line, diary):
    assert bool(DIARY.search(line)) is diary
