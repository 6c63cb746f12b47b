#!/usr/bin/env python3
"""Checks that the documents say what the tree says.

    check_docs.py [--root DIR] links
        Every relative link in README.md, CONTRIBUTING.md and docs/*.md points at a file or
        folder that exists, and its #anchor (into a Markdown file) names a heading of that file
        under GitHub's rules: lower case, spaces to '-', every other character that is not a
        letter, digit, '-' or '_' dropped; a repeated heading gets -1, -2, ... A section named
        in prose beside its file (docs/design.md, "Title") must begin a heading of that file.
    check_docs.py [--root DIR] figures
        The figures rule (CONTRIBUTING.md, "Rules a change keeps", Figures): in README.md and
        docs/guide.md, a paragraph, list item or table row that cites a benchmark page
        (docs/benchmarks.md#section or a file under benchmarks/results/) quotes only figures
        found verbatim in the cited text; one that quotes a measurement cites its source.
    check_docs.py [--root DIR] blocks --cxx COMPILER [--include DIR] [--jobs N]
        Every ```cpp block of README.md and docs/guide.md compiles on its own with
        -std=c++20 -Wall -Wextra -Werror (a block with main() is also linked). A block right
        after the comment <!-- continues --> is compiled after the block before it (of the same
        file).
    check_docs.py [--root DIR] selftest --cxx COMPILER [--include DIR]
        Copies the documents (and what they link to) to a scratch folder, checks that the copy
        passes, then plants a dead anchor, a dead link, a wrong section name, a wrong figure, an
        uncited figure and a block that does not compile, one at a time, and checks that each is
        caught (and that <!-- continues --> works). Exits 1 if the copy fails or a plant goes
        unnoticed; 77 if no compiler could try the block plants.

Each problem is printed as path:line: message. Exit status: 0 clean, 1 problems found,
77 skipped (no compiler), 2 usage error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

SKIP = 77
LINK_DOCS = ["README.md", "CONTRIBUTING.md", "docs/*.md"]
FIGURE_DOCS = ["README.md", "docs/guide.md"]
BLOCK_DOCS = ["README.md", "docs/guide.md"]
CONTINUES = "<!-- continues -->"


@dataclass
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def doc_files(root: Path, patterns: list[str]) -> list[Path]:
    files: list[Path] = []
    for pattern in patterns:
        files.extend(sorted(root.glob(pattern)))
    return [f for f in files if f.is_file()]


def rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# ---- Markdown: fences, headings, links -------------------------------------------------------

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\".*\")?\s*$")


def prose_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(1-based line number, text) of every line outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)[0] * len(match.group(1))
                continue
            out.append((number, line))
        elif match and match.group(1).startswith(fence) and not match.group(2).strip():
            fence = None
    return out


def blank_inline_code(text: str) -> str:
    """The text with each inline code span's content replaced by spaces (columns kept)."""
    return INLINE_CODE.sub(lambda m: m.group(1) + " " * len(m.group(2)) + m.group(1), text)


def heading_text(raw: str) -> str:
    """A heading as GitHub renders it: link targets, HTML tags, emphasis and code marks gone."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    parts = []
    for i, piece in enumerate(re.split(r"(`+[^`]*`+)", text)):
        if i % 2:  # a code span: its content as written
            parts.append(piece.strip("`"))
        else:
            piece = re.sub(r"<[^>]+>", "", piece)
            piece = re.sub(r"\*+|(?<!\w)_+(?=\w)|(?<=\w)_+(?!\w)", "", piece)
            parts.append(piece)
    return "".join(parts).strip()


def slug(text: str) -> str:
    """GitHub's anchor for a heading's rendered text (github-slugger's rule)."""
    out = []
    for ch in text.lower():
        if ch == " ":
            out.append("-")
        elif ch in "-_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            out.append(ch)
    return "".join(out)


@dataclass
class Heading:
    level: int
    text: str
    anchor: str
    line: int  # 1-based


def headings(lines: list[str]) -> list[Heading]:
    found: list[Heading] = []
    seen: dict[str, int] = {}
    for number, line in prose_lines(lines):
        match = HEADING.match(line)
        if not match:
            continue
        text = heading_text(match.group(2))
        base = slug(text)
        anchor = base
        if base in seen:
            seen[base] += 1
            anchor = f"{base}-{seen[base]}"
        else:
            seen[base] = 0
        found.append(Heading(len(match.group(1)), text, anchor, number))
    return found


@dataclass
class Link:
    line: int
    column: int
    target: str  # as written
    path: str  # the part before '#'
    anchor: str | None


def links(lines: list[str]) -> list[Link]:
    found: list[Link] = []
    for number, line in prose_lines(lines):
        text = blank_inline_code(line)
        for match in LINK.finditer(text):
            target = match.group(2)
            path, _, anchor = target.partition("#")
            found.append(Link(number, match.start(2), target, path, anchor if "#" in target else None))
        ref = REF_DEF.match(text)
        if ref:
            target = ref.group(1)
            path, _, anchor = target.partition("#")
            found.append(Link(number, ref.start(1), target, path, anchor if "#" in target else None))
    return found


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


class Tree:
    """The documents under one root, read once."""

    def __init__(self, root: Path):
        self.root = root
        self._lines: dict[Path, list[str]] = {}
        self._headings: dict[Path, list[Heading]] = {}

    def lines(self, path: Path) -> list[str]:
        path = path.resolve()
        if path not in self._lines:
            self._lines[path] = path.read_text(encoding="utf-8").splitlines()
        return self._lines[path]

    def headings(self, path: Path) -> list[Heading]:
        path = path.resolve()
        if path not in self._headings:
            self._headings[path] = headings(self.lines(path))
        return self._headings[path]

    def resolve(self, source: Path, link: Link) -> Path:
        if not link.path:
            return source.resolve()
        path = urllib.parse.unquote(link.path)
        if path.startswith("/"):
            return (self.root / path.lstrip("/")).resolve()
        return (source.parent / path).resolve()


def check_links(root: Path, files: list[Path] | None = None) -> list[Problem]:
    tree = Tree(root)
    problems: list[Problem] = []
    for source in files if files is not None else doc_files(root, LINK_DOCS):
        for link in links(tree.lines(source)):
            if is_external(link.target):
                continue
            where = rel(root, source)
            target = tree.resolve(source, link)
            if not target.exists():
                problems.append(Problem(where, link.line, f"link to a missing file: {link.target}"))
                continue
            if link.anchor is None or target.suffix != ".md":
                continue
            anchors = [h.anchor for h in tree.headings(target)]
            if link.anchor not in anchors:
                near = [a for a in anchors if link.anchor and (a.startswith(link.anchor[:12]))]
                hint = f" (headings near it: {', '.join('#' + a for a in near[:3])})" if near else ""
                problems.append(Problem(where, link.line,
                                        f"no heading of {rel(root, target)} has the anchor #{link.anchor}{hint}"))
        problems.extend(check_named_sections(root, tree, source))
    return problems


# A section named in prose: docs/design.md, "Title" or [design.md](design.md), "Title".
NAMED_SECTION = re.compile(r"(?:\[[^\]]*\]\(([^)#\s]+\.md)\)|(?<![\w/.-])([\w./-]+\.md))\)?,?\s+\"([^\"<][^\"]*)\"")


def check_named_sections(root: Path, tree: Tree, source: Path) -> list[Problem]:
    """A section named by its title beside its file must be the start of one of that file's headings."""
    problems: list[Problem] = []
    prose = prose_lines(tree.lines(source))
    joined = ""
    starts: list[tuple[int, int]] = []  # offset in joined, line number
    for number, line in prose:
        starts.append((len(joined), number))
        joined += blank_inline_code(line) + " "
    for match in NAMED_SECTION.finditer(joined):
        written = match.group(1) or match.group(2)
        title = " ".join(match.group(3).split())
        candidates = [(source.parent / written), (root / written), (root / "docs" / written)]
        target = next((c.resolve() for c in candidates if c.is_file()), None)
        line = max(n for offset, n in starts if offset <= match.start())
        if target is None:
            problems.append(Problem(rel(root, source), line, f"a section named in a missing file: {written}"))
            continue
        if not any(h.text.startswith(title) for h in tree.headings(target)):
            problems.append(Problem(rel(root, source), line,
                                    f"no heading of {rel(root, target)} begins with \"{title}\""))
    return problems


# ---- Figures ----------------------------------------------------------------------------------

# A number as written: 5,479 or 0.0119 or 7681; a figure is a number followed by a unit.
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = r"(?:×|x(?![A-Za-z0-9])|ns\b|µs\b|us\b|ms\b|%|KiB\b|MiB\b|GiB\b|TiB\b)"
# "A–B unit", "A to B unit", "A and B unit": both numbers carry the unit.
FIGURE = re.compile(rf"(?<![\w.,])({NUMBER})(?:\s*(?:–|-|to|and)\s*({NUMBER}))?\s?({UNIT})")
MEASURED_WORDS = re.compile(r"\b(median|medians|mean|measured)\b")
BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


@dataclass
class Unit:
    """A paragraph, list item or table row: the span a citation covers."""

    first_line: int
    lines: list[tuple[int, str]] = field(default_factory=list)


def units(lines: list[str]) -> list[Unit]:
    """The paragraphs, list items and table rows of the prose; a blank line, a heading or a code
    block ends one, a bullet or a table row starts one."""
    out: list[Unit] = []
    current: Unit | None = None
    previous = 0
    for number, line in prose_lines(lines):
        stripped = line.strip()
        if number != previous + 1:  # a code block lay in between
            current = None
        previous = number
        if not stripped or HEADING.match(line):
            current = None
            continue
        row = stripped.startswith("|")
        after_row = current is not None and current.lines[-1][1].strip().startswith("|")
        if current is None or BULLET.match(line) or row or after_row:
            current = Unit(number)
            out.append(current)
        current.lines.append((number, line))
    return out


def number_in(number: str, text: str) -> bool:
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?!\d|[.,]\d)", text) is not None


def section_text(tree: Tree, target: Path, anchor: str | None) -> str | None:
    lines = tree.lines(target)
    if anchor is None:
        return "\n".join(lines)
    heads = tree.headings(target)
    for i, head in enumerate(heads):
        if head.anchor == anchor:
            end = len(lines)
            for after in heads[i + 1:]:
                if after.level <= head.level:
                    end = after.line - 1
                    break
            return "\n".join(lines[head.line - 1:end])
    return None


def is_benchmark_source(root: Path, target: Path) -> bool:
    results = (root / "benchmarks" / "results").resolve()
    return target == (root / "docs" / "benchmarks.md").resolve() or results in target.parents


def check_figures(root: Path, files: list[Path] | None = None) -> list[Problem]:
    tree = Tree(root)
    problems: list[Problem] = []
    for source in files if files is not None else doc_files(root, FIGURE_DOCS):
        where = rel(root, source)
        for unit in units(tree.lines(source)):
            figures: list[tuple[int, str, str]] = []  # line, number, as written
            cited: list[tuple[str, str]] = []  # what the unit cites, the cited text
            whole_pages: list[tuple[int, str]] = []  # benchmarks.md cited without a section
            dead = False  # a citation names a missing section: reported once, figures unchecked
            for number, line in unit.lines:
                text = blank_inline_code(line)
                for link in links([text]):
                    if is_external(link.target):
                        continue
                    target = tree.resolve(source, link)
                    if not target.is_file() or not is_benchmark_source(root, target):
                        continue
                    if target.suffix == ".md" and link.anchor is None:
                        whole_pages.append((number, link.target))
                        continue
                    body = section_text(tree, target, link.anchor)
                    if body is None:
                        problems.append(Problem(where, number, f"cites a section that does not exist: {link.target}"))
                        dead = True
                    else:
                        cited.append((link.target, body))
                plain = LINK.sub(lambda m: m.group(1), text)  # figures in link targets are not quoted
                for match in FIGURE.finditer(plain):
                    for group in (1, 2):
                        if match.group(group):
                            figures.append((number, match.group(group), match.group(0)))
            if not figures or dead:
                continue
            for number, target in whole_pages:
                problems.append(Problem(where, number, f"a citation of figures names no section: {target} (link to "
                                        "the heading: docs/benchmarks.md#...)"))
            if whole_pages and not cited:
                continue
            if cited:
                for number, value, written in figures:
                    if not any(number_in(value, body) for _, body in cited):
                        names = ", ".join(target for target, _ in cited)
                        problems.append(Problem(where, number,
                                                f"the figure {value} (in \"{written}\") is not in the cited {names}"))
                continue
            prose = " ".join(blank_inline_code(line) for _, line in unit.lines)
            measured = [(n, w) for n, v, w in figures if "." in v or w.endswith(("×", "x"))]
            if measured or MEASURED_WORDS.search(prose):
                number, written = measured[0] if measured else (figures[0][0], figures[0][2])
                problems.append(Problem(where, number, f"a measured figure (\"{written}\") without a citation: "
                                        "link the benchmark section or results file it comes from"))
    return problems


# ---- Code blocks ------------------------------------------------------------------------------


@dataclass
class Block:
    path: str
    line: int  # the opening fence's line, 1-based
    code: str
    continues: bool


def cpp_blocks(lines: list[str], where: str) -> list[Block]:
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence = match.group(1)
        info = match.group(2).strip().split()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = FENCE.match(lines[j])
            if close and close.group(1).startswith(fence) and not close.group(2).strip():
                break
            body.append(lines[j])
            j += 1
        if info and info[0] in ("cpp", "c++"):
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            continues = k >= 0 and lines[k].strip() == CONTINUES
            blocks.append(Block(where, i + 1, "\n".join(body) + "\n", continues))
        i = j + 1
    return blocks


def translation_unit(blocks: list[Block], index: int) -> str:
    """The block at index with the blocks it continues, each under a #line naming its place."""
    first = index
    while first > 0 and blocks[first].continues:
        first -= 1
    parts = []
    for block in blocks[first:index + 1]:
        parts.append(f'#line {block.line + 1} "{block.path}"\n{block.code}')
    return "".join(parts)


def compile_block(cxx: str, include: Path, block: Block, source: str, scratch: Path, index: int) -> Problem | None:
    name = scratch / f"block{index}.cpp"
    name.write_text(source, encoding="utf-8")
    flags = ["-std=c++20", "-Wall", "-Wextra", "-Werror", f"-I{include}"]
    if re.search(r"\bint\s+main\s*\(", block.code):
        command = [cxx, *flags, "-pthread", str(name), "-o", str(scratch / f"block{index}")]
    else:
        command = [cxx, *flags, "-fsyntax-only", str(name)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return None
    output = result.stderr.strip().splitlines()
    shown = "\n    ".join(output[:30] + (["..."] if len(output) > 30 else []))
    return Problem(block.path, block.line, f"this ```cpp block does not compile ({command[0]}):\n    {shown}")


def compiler_works(cxx: str) -> str | None:
    """None if cxx compiles C++20, else why not."""
    if not cxx:
        return "no C++ compiler given"
    if shutil.which(cxx) is None and not Path(cxx).is_file():
        return f"the compiler {cxx} is not found"
    probe = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", "-x", "c++", "-"], input="#include <vector>\n",
                           capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"{cxx} cannot compile C++20: {probe.stderr.strip()[:200]}"


def check_blocks(root: Path, cxx: str, include: Path, jobs: int, files: list[Path] | None = None,
                 only: set[tuple[str, int]] | None = None, verbose: bool = True) -> list[Problem]:
    tree = Tree(root)
    work: list[tuple[Block, str]] = []
    for source in files if files is not None else doc_files(root, BLOCK_DOCS):
        blocks = cpp_blocks(tree.lines(source), rel(root, source))
        for i, block in enumerate(blocks):
            if only is None or (block.path, block.line) in only:
                work.append((block, translation_unit(blocks, i)))
    problems: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="check_docs_") as scratch:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(compile_block, cxx, include, block, code, Path(scratch), i)
                       for i, (block, code) in enumerate(work)]
            for (block, _), future in zip(work, futures):
                problem = future.result()
                if verbose:
                    print(f"{block.path}:{block.line}: {'FAILED' if problem else 'ok'}", flush=True)
                if problem:
                    problems.append(problem)
    return problems


# ---- Self-test --------------------------------------------------------------------------------


def copy_docs(root: Path, scratch: Path) -> None:
    """The documents and every file they link to, into scratch (same relative paths)."""
    tree = Tree(root)
    sources = doc_files(root, LINK_DOCS)
    wanted: set[Path] = set(sources)
    for source in sources:
        for link in links(tree.lines(source)):
            if is_external(link.target):
                continue
            target = tree.resolve(source, link)
            if target.exists() and root.resolve() in [target, *target.parents]:
                wanted.add(target)
    for path in wanted:
        destination = scratch / path.relative_to(root.resolve())
        if path.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


def cited_figures(root: Path) -> list[tuple[Path, int, str, list[str]]]:
    """(file, line, number, the cited texts) of each figure a cited unit of README.md or docs/guide.md quotes."""
    tree = Tree(root)
    found: list[tuple[Path, int, str, list[str]]] = []
    for source in doc_files(root, FIGURE_DOCS):
        for unit in units(tree.lines(source)):
            bodies = []
            for _, line in unit.lines:
                for link in links([blank_inline_code(line)]):
                    if is_external(link.target):
                        continue
                    target = tree.resolve(source, link)
                    if target.is_file() and is_benchmark_source(root, target):
                        body = section_text(tree, target, link.anchor)
                        if body is not None:
                            bodies.append(body)
            if not bodies:
                continue
            for number, line in unit.lines:
                for match in FIGURE.finditer(LINK.sub(lambda m: m.group(1), blank_inline_code(line))):
                    found.append((source, number, match.group(1), bodies))
    return found


def wrong_figure(root: Path) -> tuple[Path, int, str, str] | None:
    """A cited figure with a decimal point and a value one digit off that its cited text does not hold."""
    for path, line, value, bodies in cited_figures(root):
        if "." not in value:
            continue
        for step in range(1, 10):
            wrong = value[:-1] + str((int(value[-1]) + step) % 10)
            if not any(number_in(wrong, body) for body in bodies):
                return path, line, value, wrong
    return None


def plant_line(path: Path, line: int, old: str, new: str) -> None:
    """Replaces the first standalone occurrence of the number old on that line by new."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    pattern = re.compile(rf"(?<![\w.,]){re.escape(old)}(?!\d|[.,]\d)")
    lines[line - 1] = pattern.sub(new, lines[line - 1], count=1)
    path.write_text("".join(lines), encoding="utf-8")


def selftest(root: Path, cxx: str, include: Path) -> int:
    failures: list[str] = []
    why_not = compiler_works(cxx)
    with tempfile.TemporaryDirectory(prefix="check_docs_selftest_") as scratch_name:
        scratch = Path(scratch_name)
        copy_docs(root, scratch)
        guide = scratch / "docs" / "guide.md"

        def report(name: str, problems: list[Problem], expect_fail: bool, *expect: str) -> None:
            """Each expected failure must be reported by one problem holding every string of expect."""
            found = [str(p) for p in problems]
            if expect_fail:
                hit = [p for p in found if all(e in p for e in expect)]
                if hit:
                    print(f"selftest: {name}: caught, as it must be:\n    {hit[0].splitlines()[0]}")
                else:
                    failures.append(f"{name}: not caught (expected a report containing {expect!r}; got {found})")
                    print(f"selftest: {name}: NOT CAUGHT")
            elif found:
                failures.append(f"{name}: fails, and must not: {found[:3]}")
                print(f"selftest: {name}: fails, and must not:\n    " + "\n    ".join(found[:5]))
            else:
                print(f"selftest: {name}: passes, as it must")

        # The copy itself passes: the plants below are what fails.
        report("the unplanted copy's links", check_links(scratch), False)
        report("the unplanted copy's figures", check_figures(scratch), False)

        # 1. A dead anchor.
        original = guide.read_text(encoding="utf-8")
        lines = original.splitlines(keepends=True)
        planted_line = len(lines) + 2
        guide.write_text(original + "\nSee [the results](benchmarks.md#no-such-section-planted).\n", encoding="utf-8")
        report("planted dead anchor", check_links(scratch), True, f"docs/guide.md:{planted_line}: no heading")
        guide.write_text(original + "\nSee [the notes](no-such-file.md).\n", encoding="utf-8")
        report("planted dead link", check_links(scratch), True, f"docs/guide.md:{planted_line}: link to a missing")
        guide.write_text(original + "\nSee design.md, \"No such section planted\".\n", encoding="utf-8")
        report("planted section name", check_links(scratch), True, f"docs/guide.md:{planted_line}: no heading")
        guide.write_text(original, encoding="utf-8")

        # 2. A wrong figure: a cited figure with one digit changed (to a value the cited text lacks).
        planted = wrong_figure(scratch)
        if planted is None:
            failures.append("planted wrong figure: no cited figure found in README.md or docs/guide.md to alter")
        else:
            path, line, value, wrong = planted
            saved = path.read_text(encoding="utf-8")
            plant_line(path, line, value, wrong)
            report(f"planted wrong figure ({value} -> {wrong} at {rel(scratch, path)}:{line})", check_figures(scratch),
                   True, f"{rel(scratch, path)}:{line}: the figure {wrong}")
            path.write_text(saved, encoding="utf-8")

        # 2b. A measured figure without a citation.
        guide.write_text(original + "\nThe reaper frees 1 GiB in 12.5 ms.\n", encoding="utf-8")
        report("planted uncited figure", check_figures(scratch), True, f"docs/guide.md:{planted_line}: a measured")
        guide.write_text(original, encoding="utf-8")

        # 3. A block that does not compile (only the planted block is compiled).
        if why_not:
            print(f"selftest: planted block skipped: {why_not}")
        else:
            block_line = len(lines) + 2
            guide.write_text(original + "\n```cpp\n#include <teardown/reaper.hpp>\n\n"
                             "void planted() { teardown::no_such_name(); }\n```\n", encoding="utf-8")
            problems = check_blocks(scratch, cxx, include, 1, [guide], {("docs/guide.md", block_line)}, False)
            report("planted non-compiling block", problems, True, f"docs/guide.md:{block_line}: ", "no_such_name")
            guide.write_text(original, encoding="utf-8")
            # A continued block sees the block before it; without the marker it does not.
            guide.write_text(original + "\n```cpp\nint planted_value = 1;\n```\n\n" + CONTINUES +
                             "\n\n```cpp\nint planted_copy = planted_value;\n```\n", encoding="utf-8")
            second = len(lines) + 6
            report("continued block",
                   check_blocks(scratch, cxx, include, 1, [guide], {("docs/guide.md", second)}, False), False)
            guide.write_text(original + "\n```cpp\nint planted_value = 1;\n```\n\n"
                             "```cpp\nint planted_copy = planted_value;\n```\n", encoding="utf-8")
            second = len(lines) + 6
            report("block without the marker", check_blocks(scratch, cxx, include, 1, [guide],
                                                             {("docs/guide.md", second)}, False),
                   True, f"docs/guide.md:{second}: ")
            guide.write_text(original, encoding="utf-8")

    if failures:
        print("selftest FAILED:\n  " + "\n  ".join(failures))
        return 1
    if why_not:
        print(f"SKIPPED: the links and figures plants were caught; the block plants need a compiler: {why_not}")
        return SKIP
    print("selftest: every plant was caught")
    return 0


# ---- Main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the tree whose documents are checked (default: this checkout)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("links", help="relative links and anchors")
    sub.add_parser("figures", help="figures against the benchmark sections they cite")
    for name in ("blocks", "selftest"):
        p = sub.add_parser(name, help="compile the ```cpp blocks" if name == "blocks" else "plant faults in a copy")
        p.add_argument("--cxx", required=True, help="the C++ compiler (CMake's CMAKE_CXX_COMPILER)")
        p.add_argument("--include", type=Path, default=None, help="the include folder (default: ROOT/include)")
        if name == "blocks":
            p.add_argument("--jobs", type=int, default=2, help="compiles at once (default 2)")
    args = parser.parse_args()
    root = args.root.resolve()
    if not root.is_dir():
        print(f"check_docs: no folder {root}", file=sys.stderr)
        return 2

    if args.command == "selftest":
        include = (args.include or root / "include").resolve()
        return selftest(root, args.cxx, include)
    if args.command == "links":
        problems = check_links(root)
    elif args.command == "figures":
        problems = check_figures(root)
    else:
        why_not = compiler_works(args.cxx)
        if why_not:
            print(f"SKIPPED: {why_not}")
            return SKIP
        include = (args.include or root / "include").resolve()
        problems = check_blocks(root, args.cxx, include, args.jobs)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_docs {args.command}: {len(problems)} problem(s)")
        return 1
    print(f"check_docs {args.command}: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
