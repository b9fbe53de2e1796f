"""README.md stays at most 20,000 bytes; every relative link in README.md and docs/*.md resolves (file and anchor)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (word characters, '-' and ' ' kept), each
    space a '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, seen = set(), {}
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text(encoding="utf-8")))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: are not relative


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken(path: Path) -> list[str]:
    bad = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no file {rel(dest)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {rel(dest)}")
    return bad


def test_readme_is_at_most_20000_bytes():
    size = (ROOT / "README.md").stat().st_size
    assert size <= 20_000, f"README.md is {size} bytes; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken(page) == []


def test_the_docs_exist_and_the_readme_links_every_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 5
    assert [p.name for p in pages if p.resolve() not in linked] == []


def test_the_checker_catches_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "b.md").write_text("# A heading: with `code`, punctuation & more\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#a-heading-with-code-punctuation--more) [gone](c.md) [no](b.md#nope) "
                    "`[in code](d.md)` [web](https://example.com/x)\n```\n[fenced](e.md)\n```\n")
    assert [b.split(":")[0] for b in broken(page)] == ["c.md", "b.md#nope"]
