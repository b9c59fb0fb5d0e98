"""The project's Markdown pages: every relative link names a file of the repository and, where it
has a ``#fragment``, a heading of that file (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens)."""

import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT

PAGES = sorted({*Path(REPO_ROOT).glob("*.md"), *Path(REPO_ROOT).glob("docs/**/*.md"),
                *Path(REPO_ROOT).glob("examples/**/*.md")})
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set:
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def relative_links(page: Path):
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if not re.match(r"[a-z]+:", target):
            yield target


def test_the_pages_are_found():
    assert {"README.md", "docs/measurements.md", "examples/comparison/README.md"} <= {
        str(page.relative_to(REPO_ROOT)) for page in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_relative_link_names_a_file_and_heading_that_exist(page):
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.name}")
    assert not broken, broken


def test_every_method_in_the_readme_table_has_a_citation_entry():
    """Each paper of the README's method table, "(Surname et al., [VENUE] YEAR)", has a BibTeX entry in
    CITATION.bib whose first author and year are those."""
    readme = Path(REPO_ROOT, "README.md").read_text(encoding="utf-8")
    papers = set(re.findall(r"^\| [^|(]+\((\w+) et al\., (?:[A-Za-z-]+ )?(\d{4})\) \|", readme, flags=re.MULTILINE))
    assert len(papers) >= 8  # the five seed papers, DenseFormer, hyper-connections, mHC
    bib = Path(REPO_ROOT, "CITATION.bib").read_text(encoding="utf-8")
    entries = re.findall(r"author\s*=\s*\{(\w+),.*?\n\s*year\s*=\s*\{(\d{4})\}", bib, flags=re.DOTALL)
    cited = {(surname, year) for surname, year in entries}
    assert papers <= cited, f"not in CITATION.bib: {sorted(papers - cited)}"


def table_blocks(text: str):
    """Each run of consecutive lines starting with ``|`` outside code blocks: (first line's number, lines)."""
    block, start, fenced = [], 0, False
    for number, line in enumerate(text.splitlines() + [""], start=1):
        fenced ^= line.lstrip().startswith("```")
        if line.startswith("|") and not fenced:
            start = start if block else number
            block.append(line)
        elif block:
            yield start, block
            block = []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_table_has_its_header_row(page):
    """A table's second line is its separator (``|---|``): a blank line inside a table starts a block
    that Markdown shows as text."""
    broken = [f"line {start}: {lines[0][:60]}" for start, lines in table_blocks(page.read_text(encoding="utf-8"))
              if len(lines) < 2 or not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[1].strip())]
    assert not broken, broken


RECORDED_AS_RUN = "--path /tmp/dense_readings/ft_R/checkpoint_last.pt"  # its README says it ran without


def test_every_generate_command_shown_keeps_the_last_batch():
    """docs/models.md: the pages' fairseq-generate commands pass --required-batch-size-multiple 1
    (fairseq drops a last batch that is not a multiple of 8); one shown without it was copied as shown."""
    missing = []
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            for command in re.findall(r"^\s*(?:\S+=\S+ )*fairseq-generate .*$", re.sub(r"\\\n", " ", block), re.M):
                if "--required-batch-size-multiple 1" not in command and RECORDED_AS_RUN not in command:
                    missing.append(f"{page.relative_to(REPO_ROOT)}: {command[:80]}")
    assert not missing
