"""Every relative link in README.md and docs/*.md points at a file that exists, and every
`#anchor` at a heading of its target page (GitHub's heading slugs). Pure Python, no JAX."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BACK_LINK = "[← back to the README](../README.md)"

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
# [text](target) and ![alt](target), an optional "title" after the target
_INLINE = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks and HTML comments."""
    text = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        match = _FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower case, punctuation dropped,
    spaces as hyphens."""
    text = _INLINE.sub(lambda m: m.group(1), heading)  # a link in a heading anchors by its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, duplicates numbered -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(page.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(page: Path):
    """(line number, target) of every link of a page, outside code; a link's text may run over
    several lines."""
    lines = [""] * (page.read_text(encoding="utf-8").count("\n") + 1)
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        lines[number - 1] = _CODE_SPAN.sub("", line)
    for number, line in enumerate(lines, 1):
        match = _REFERENCE.match(line)
        if match:
            yield number, match.group(1)
    text = "\n".join(lines)
    for match in _INLINE.finditer(text):
        yield text.count("\n", 0, match.start(2)) + 1, match.group(2)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for number, target in links(page):
        if _EXTERNAL.match(target) or target.startswith("//"):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where}: no file {path}")
            continue
        if anchor and resolved.suffix == ".md" and resolved.is_file():
            if anchor not in anchors(resolved):
                problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(root)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_pages_link_back_to_the_readme(page):
    head = page.read_text(encoding="utf-8").split("\n")[:5]
    assert BACK_LINK in head, f"{page.relative_to(ROOT)}: no '{BACK_LINK}' line at its top"


def test_the_checker_finds_links_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "a.md"
    (tmp_path / "b.md").write_text(
        "# Title\n\n## Using it: the sandbox (issue 19)\n\n## Notes\n\n## Notes\n",
        encoding="utf-8")
    page.write_text(
        "# A\n\n[ok](../b.md#using-it-the-sandbox-issue-19) [dup](../b.md#notes-1) [self](#a)\n"
        "[gone](../c.md) [bad](../b.md#nowhere) [web](https://example.org/x.md)\n"
        "`[code](../nothing.md)`\n```\n[fenced](../nothing.md)\n```\n"
        "> [two\n> lines](../b.md#notes)\n",
        encoding="utf-8")
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 2, problems
    assert "no file ../c.md" in problems[0] and "no heading #nowhere" in problems[1]
    assert slug("COS(M+O)S: `sampling/mcts.py` × [x](y.md)") == "cosmos-samplingmctspy--x"
