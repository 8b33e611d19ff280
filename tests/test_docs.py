"""The repository explains itself: every citation of a file under docs/ in the code, the
proofs, the tests and the READMEs resolves (docs/design.md, "Layout").

A citation is ``docs/<path>.md``, optionally followed by sections ``§N`` (lists and ranges
such as ``§3–§6, §8``) and by quoted titles (``"Title"``, ``("A", "B")``, ``, "Title"``).
Checked: (a) the file exists; (b) for ``§N`` the file has a heading ``## N.``; (c) a quoted
title is part of a heading of the file (inside section N when exactly one section is
cited); after a colon (``docs/x.md: "text"``) the quote is a passage of the file's text.
Also: README.md links every docs/*.md, and every relative markdown link of the markdown
files (README.md, docs/, the packages' READMEs) resolves (file, and GitHub-style anchor).
Files are found by scanning, so modules may move without editing this test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCAN_DIRS = ("dosa_ref", "dosa_cupy", "proofs", "tests")
SUFFIXES = {".py", ".cu", ".cuh", ".md", ".sh"}

# A line break inside a comment or docstring, with the next line's comment marker.
_BREAK = re.compile(r"[ \t]*\n[ \t]*(?:#+|//+|\*(?!\*))?[ \t]*")
_SECTION = r"§\d+(?:\s*[–-]\s*§?\d+)?"
_CITE = re.compile(
    r"docs/(?P<path>(?:[\w.-]+/)*[\w.-]+\.md)`?"
    r"(?P<sections>\s*" + _SECTION + r"(?:\s*,\s*" + _SECTION + r")*)?"
    r"(?P<sep>\s*[,:]?\s*\(?\s*)"
    r"(?P<quotes>\"[^\"]+\"(?:\s*,\s*\"[^\"]+\")*)?"
)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for d in SCAN_DIRS:
        files += [p for p in sorted((ROOT / d).rglob("*")) if p.suffix in SUFFIXES]
    files += sorted((ROOT / "docs").glob("*.md"))
    return [p for p in files if p.is_file() and p.resolve() != Path(__file__).resolve()]


def _strip_code(md: str) -> str:
    """Markdown without fenced code blocks (their lines are not headings or links)."""
    out, fence = [], False
    for line in md.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        out.append("" if fence else line)
    return "\n".join(out)


def headings(md: str) -> list[tuple[int, str]]:
    """(level, text) of every ATX heading outside code fences."""
    found = []
    for line in _strip_code(md).splitlines():
        m = _HEADING.match(line)
        if m:
            found.append((len(m.group(1)), m.group(2)))
    return found


def section_headings(md: str, n: int) -> list[str] | None:
    """Headings of section ``## n.`` (itself and its subheadings), None if it is absent."""
    hs = headings(md)
    for i, (lvl, text) in enumerate(hs):
        if lvl == 2 and re.match(rf"{n}\.(\s|$)", text):
            out = [text]
            for lvl2, t2 in hs[i + 1 :]:
                if lvl2 <= 2:
                    break
                out.append(t2)
            return out
    return None


def _numbers(sections: str) -> list[int]:
    nums = []
    for a, b in re.findall(r"§(\d+)(?:\s*[–-]\s*§?(\d+))?", sections or ""):
        lo = int(a)
        hi = int(b) if b else lo
        nums += list(range(lo, hi + 1)) if hi >= lo else [lo, hi]
    return nums


def _norm(s: str) -> str:
    return " ".join(s.replace("`", "").split())


def citation_errors(text: str, where: str, root: Path = ROOT) -> list[str]:
    """Problems of the docs/ citations in ``text`` (the contents of file ``where``)."""
    errors = []
    flat = _BREAK.sub(" ", text)
    for m in _CITE.finditer(flat):
        rel = "docs/" + m.group("path")
        target = root / rel
        cite = _norm(m.group(0))
        if not target.is_file():
            errors.append(f"{where}: {cite!r}: {rel} does not exist")
            continue
        md = target.read_text(encoding="utf-8")
        nums = _numbers(m.group("sections"))
        for n in nums:
            if section_headings(md, n) is None:
                errors.append(f"{where}: {cite!r}: {rel} has no heading '## {n}.'")
        if not m.group("quotes"):
            continue
        titles = re.findall(r"\"([^\"]+)\"", m.group("quotes"))
        if ":" in m.group("sep"):  # a quoted passage of the text, not a heading title
            body = _norm(md)
            errors += [
                f"{where}: {cite!r}: passage {t!r} not found in {rel}"
                for t in titles
                if _norm(t) not in body
            ]
            continue
        if len(nums) == 1 and section_headings(md, nums[0]) is not None:
            pool, scope = section_headings(md, nums[0]), f"§{nums[0]} of {rel}"
        else:
            pool, scope = [t for _, t in headings(md)], rel
        pool = [_norm(t) for t in pool]
        errors += [
            f"{where}: {cite!r}: no heading of {scope} contains {t!r}"
            for t in titles
            if not any(_norm(t) in h for h in pool)
        ]
    return errors


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces → '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(md: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, text in headings(md):
        s = slug(text)
        k = seen.get(s, 0)
        out.add(s if k == 0 else f"{s}-{k}")
        seen[s] = k + 1
    return out


def link_errors(path: Path) -> list[str]:
    """Relative links of markdown file ``path`` whose file or #anchor does not exist."""
    md = path.read_text(encoding="utf-8")
    text = re.sub(r"`[^`\n]*`", "", _strip_code(md))  # inline code is not a link
    errors = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            errors.append(f"{path.relative_to(ROOT)}: link {target!r}: no such file")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md":
            if anchor not in anchors(dest.read_text(encoding="utf-8")):
                errors.append(f"{path.relative_to(ROOT)}: link {target!r}: no such heading")
    return errors


def test_scan_finds_citations():
    n = sum(len(_CITE.findall(_BREAK.sub(" ", p.read_text(encoding="utf-8")))) for p in
            scanned_files())  # fmt: skip
    assert n > 50, f"only {n} citations of docs/ found: is the scan broken?"


def test_every_docs_citation_resolves():
    errors = []
    for p in scanned_files():
        errors += citation_errors(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    assert not errors, "\n".join(errors)


def test_method_has_the_twelve_sections():
    md = (ROOT / "docs" / "method.md").read_text(encoding="utf-8")
    missing = [n for n in range(1, 13) if section_headings(md, n) is None]
    assert not missing, f"docs/method.md lacks sections {missing}"


def test_readme_links_every_doc():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {t.partition("#")[0] for t in _LINK.findall(_strip_code(readme))}
    missing = [
        f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))
        if f"docs/{p.name}" not in linked
    ]  # fmt: skip
    assert not missing, f"README.md does not link {missing}"


def test_markdown_links_resolve():
    errors = []
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *scanned_files()]:
        if p.suffix == ".md":
            errors += link_errors(p)
    assert not errors, "\n".join(errors)


# --- the checker itself catches bad citations (planted in synthetic text) ----------------


@pytest.mark.parametrize(
    "text, expect",
    [
        ("see docs/nowhere.md §1", "does not exist"),
        ("(docs/method.md §13)", "no heading '## 13.'"),
        ("(docs/method.md §3–§14, §8)", "no heading '## 14.'"),
        ('docs/method.md §6 "Refinement"', "no heading of §6"),
        ('docs/records/notes.md "No such title"', "no heading of docs/records/notes.md"),
        ('docs/records/benchmarks.md ("Decode", "Nope")', "'Nope'"),
        ('docs/design.md: "a sentence that is not there"', "not found"),
        ('# docs/design.md, "Public\n# contract of nothing"', "contract of nothing"),
    ],
)
def test_checker_catches_planted_citation(text, expect):
    errors = citation_errors(text, "planted")
    assert errors and expect in "\n".join(errors), errors


@pytest.mark.parametrize(
    "text",
    [
        "docs/method.md §8; docs/numerics.md",
        '(docs/method.md §9, "Refinement")',
        'docs/method.md §9 "compact score code"',
        'docs/records/benchmarks.md ("Decode", "Decode grid")',
        '"""(docs/design.md: "each kernel\'s reference\nfunction by the same name in dosa_ref")',
        "docs/method.md §2's seeds; dosa_ref.select's \"certificate\" strategy",
    ],
)
def test_checker_accepts_good_citation(text):
    assert citation_errors(text, "good") == []


def test_slug_matches_github():
    assert slug("8. Numerical certificate for FP8 keys (Appendix C)") == (
        "8-numerical-certificate-for-fp8-keys-appendix-c"
    )
    assert slug("Margins (B.3)") == "margins-b3"
    assert slug("`dosa bench`: floors") == "dosa-bench-floors"
