#!/usr/bin/env python3
"""Checks the relative links of every tracked Markdown file (Python 3 standard library only).

For each `*.md` file that git tracks, every Markdown link or image target (`[text](target)`,
`![alt](target)`, a reference definition `[label]: target`, and `href`/`src` in inline HTML)
that is not absolute (`http:`, `https:`, `mailto:` or any other scheme, or `//host`) must
  - name a path that stays inside the repository (`../shared/...` from `docs/` does not),
  - name a file or directory that git tracks (a clone has nothing else),
  - and, with a `#fragment`, name a heading anchor of the target Markdown file (GitHub's rules:
    lowercase, punctuation other than `-` and `_` dropped, each space a `-`, a repeated heading
    suffixed `-1`, `-2`, ...; `<a name=...>`/`id=...` anchors count too). On other files only
    GitHub's line anchors (`#L10`, `#L10-L20`) are accepted.
A fragment-only link (`#foo`) is checked against the file it is in. Links inside fenced code
blocks, inline code and HTML comments are not links and are skipped; but inline code that is a
path starting with `../` is reported unless it names a tracked path relative to its file, since
a path above the repository root (such as `../shared/...`) is not in a reader's clone.

Usage: scripts/check_links.py [REPO_ROOT]   (default: the repository this script is in)
Prints `file:line: target: reason` for each broken link and exits 1; otherwise one summary line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from urllib.parse import unquote

SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
REF_DEF = re.compile(r"^ {0,3}\[((?:[^\]\\]|\\.)+)\]:[ \t]*(<[^>\n]*>|\S+)", re.M)
HTML_ATTR = re.compile(r"<(?:a|img)\b[^>]*?\b(href|src)\s*=\s*(\"[^\"]*\"|'[^']*')", re.I)
HTML_ANCHOR = re.compile(r"<[a-z][^>]*?\b(?:name|id)\s*=\s*(\"[^\"]*\"|'[^']*')", re.I)
LINE_ANCHOR = re.compile(r"^L\d+(C\d+)?(-L\d+(C\d+)?)?$")
COMMENT = re.compile(r"<!--.*?-->", re.S)


def repo_files(root: str) -> list[str]:
    """Paths git tracks under `root` (relative, `/`-separated)."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"check_links: cannot list the repository's files with git ({e})")
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def mask(text: str, spans: list | None = None) -> str:
    """`text` with fenced code blocks, inline code spans and HTML comments blanked out (each
    character of them a space, newlines kept), so offsets and line numbers stay valid. The
    inline code spans are appended to `spans` as (offset, content)."""
    out = list(text)

    def blank(a: int, b: int) -> None:
        for i in range(a, b):
            if out[i] != "\n":
                out[i] = " "

    # Fenced code blocks: from an opening fence to a closing one of the same character and at
    # least its length (or to the end of the file).
    pos, fence = 0, None
    for line in text.splitlines(keepends=True):
        m = FENCE.match(line.rstrip("\n"))
        if fence is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                fence, start = m.group(1), pos
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            blank(start, pos + len(line))
            fence = None
        pos += len(line)
    if fence is not None:
        blank(start, len(text))

    for m in COMMENT.finditer(text):
        blank(m.start(), m.end())

    # Inline code: a run of N backticks up to the next run of exactly N, within one paragraph.
    masked = "".join(out)
    for para in re.finditer(r"(?:[^\n]|\n(?![ \t]*\n))+", masked):
        s, i = para.group(0), 0
        while True:
            m = re.compile(r"(?<![`\\])`+").search(s, i)
            if not m:
                break
            run = m.group(0)
            close = re.compile(r"(?<!`)" + run + r"(?!`)").search(s, m.end())
            if not close:
                i = m.end()
                continue
            blank(para.start() + m.start(), para.start() + close.end())
            if spans is not None:
                spans.append((para.start() + m.end(), s[m.end():close.start()].strip()))
            i = close.end()
    return "".join(out)


def heading_text(raw: str) -> str:
    """The visible text of a heading's inline Markdown: code kept verbatim, links and images
    reduced to their text, emphasis markers and HTML tags dropped."""
    parts = re.split(r"(`+)(.+?)\1", raw)
    text = []
    for i in range(0, len(parts), 3):
        t = parts[i]
        t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", t)
        t = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", t)
        t = re.sub(r"<[^>]+>", "", t)
        t = re.sub(r"\\(.)", r"\1", t)
        t = t.replace("*", "")
        t = re.sub(r"(^|[^\w])_+|_+(?=[^\w]|$)", r"\1", t)
        text.append(t)
        if i + 2 < len(parts):
            text.append(parts[i + 2])
    return "".join(text).strip()


def slug(text: str) -> str:
    """GitHub's heading anchor: lowercase, drop every character that is not a letter, mark,
    number, connector (`_`), space or hyphen, then each space becomes a hyphen."""
    keep = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            keep.append("-" if ch == " " else ch)
    return "".join(keep)


def anchors(text: str, masked: str) -> set[str]:
    """Every anchor a Markdown file defines: its headings' slugs (repeats suffixed -1, -2, ...)
    and explicit HTML `name`/`id` attributes. Headings are found in `masked` (so none inside
    code blocks count) and their text read from `text` (so inline code in them is kept)."""
    found: set[str] = set()
    seen: dict[str, int] = {}

    def add(base: str) -> None:
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1

    lines, originals = masked.split("\n"), text.split("\n")
    for i, line in enumerate(lines):
        if ATX.match(line):
            add(slug(heading_text(ATX.match(originals[i]).group(2) or "")))
            continue
        if i > 0 and SETEXT.match(line):
            prev = lines[i - 1]
            if prev.strip() and not ATX.match(prev) and not re.match(r"^ {0,3}([>|*+-]|\d+[.)])", prev) \
                    and not SETEXT.match(prev):
                add(slug(heading_text(originals[i - 1].strip())))
    for m in HTML_ANCHOR.finditer(masked):
        found.add(m.group(1)[1:-1])
    return found


def inline_targets(masked: str):
    """(offset, target) of every inline link or image `[text](target ...)`."""
    for m in re.finditer(r"\]\(", masked):
        # The link text's opening bracket, balanced, within the paragraph.
        depth, j = 0, m.start()
        while j >= 0:
            c = masked[j]
            if c == "\n" and masked[j - 1:j] == "\n":
                j = -1
                break
            if c == "]" and masked[j - 1:j] != "\\":
                depth += 1
            elif c == "[" and masked[j - 1:j] != "\\":
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        if j < 0:
            continue
        k = m.end()
        while k < len(masked) and masked[k] in " \t":
            k += 1
        if masked[k:k + 1] == "<":
            end = masked.find(">", k)
            if end < 0 or "\n" in masked[k:end]:
                continue
            yield k, masked[k + 1:end]
            continue
        depth, e = 0, k
        while e < len(masked) and not masked[e].isspace():
            c = masked[e]
            if c == "\\":
                e += 2
                continue
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    break
                depth -= 1
            e += 1
        yield k, masked[k:e]


def all_targets(masked: str):
    yield from inline_targets(masked)
    for m in REF_DEF.finditer(masked):
        t = m.group(2)
        yield m.start(2), t[1:-1] if t.startswith("<") else t
    for m in HTML_ATTR.finditer(masked):
        yield m.start(2), m.group(2)[1:-1]


def main() -> int:
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    files = repo_files(root)
    tracked = set(files)
    dirs = {os.path.dirname(p) for p in files}
    for d in list(dirs):
        while d:
            d = os.path.dirname(d)
            dirs.add(d)
    md_files = sorted(p for p in files if p.endswith(".md") and os.path.isfile(os.path.join(root, p)))

    text_of: dict[str, str] = {}
    masked_of: dict[str, str] = {}
    spans_of: dict[str, list] = {}
    anchors_of: dict[str, set[str]] = {}

    def masked(path: str) -> str:
        if path not in masked_of:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                text_of[path] = f.read()
            spans_of[path] = []
            masked_of[path] = mask(text_of[path], spans_of[path])
        return masked_of[path]

    def anchors_in(path: str) -> set[str]:
        if path not in anchors_of:
            m = masked(path)
            anchors_of[path] = anchors(text_of[path], m)
        return anchors_of[path]

    broken, checked = [], 0
    for md in md_files:
        text = masked(md)
        for offset, target in all_targets(text):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            checked += 1
            line = text.count("\n", 0, offset) + 1

            def bad(reason: str) -> None:
                broken.append((md, line, f"{md}:{line}: {target}: {reason}"))

            path_part, _, fragment = target.partition("#")
            path_part = unquote(path_part.split("?", 1)[0])
            fragment = unquote(fragment)
            if path_part:
                base = "" if path_part.startswith("/") else os.path.dirname(md)
                resolved = os.path.normpath(os.path.join(base, path_part.lstrip("/")))
                if resolved == ".":
                    resolved = ""
                if resolved == ".." or resolved.startswith("../") or os.path.isabs(resolved):
                    bad("leaves the repository (a clone has nothing there)")
                    continue
                if resolved not in tracked and resolved not in dirs:
                    if os.path.exists(os.path.join(root, resolved)):
                        bad("exists here but is not tracked by git (a clone will not have it)")
                    else:
                        bad("no such file in the repository")
                    continue
            else:
                resolved = md
            if not fragment:
                continue
            if resolved in dirs:
                bad("a fragment on a directory")
            elif resolved.endswith(".md"):
                if fragment not in anchors_in(resolved):
                    near = sorted(a for a in anchors_in(resolved) if a.lower() == fragment.lower())
                    hint = f" (did you mean #{near[0]}?)" if near else ""
                    bad(f"no heading with anchor #{fragment} in {resolved}{hint}")
            elif not LINE_ANCHOR.match(fragment):
                bad(f"#{fragment} is not a line anchor (#L10, #L10-L20) and {resolved} is not Markdown")

        # Not a link, but the same mistake: inline code naming a path above the repository
        # (`../shared/...`), which a reader's clone does not have. Paths in inline code are
        # written from the repository root, so one starting with `../` leaves it, unless it
        # names a tracked path relative to the file itself.
        for offset, code in spans_of[md]:
            if code.startswith("../") and not any(c.isspace() for c in code):
                resolved = os.path.normpath(os.path.join(os.path.dirname(md), code.split("#")[0]))
                outside = resolved == ".." or resolved.startswith("../")
                if outside or (resolved not in tracked and resolved not in dirs):
                    line = text.count("\n", 0, offset) + 1
                    broken.append((md, line, f"{md}:{line}: {code}: inline code names a path outside the repository"))

    for _, _, message in sorted(broken):
        print(message)
    if broken:
        print(f"check_links: {len(broken)} problem(s) ({checked} relative links checked in {len(md_files)} "
              "Markdown files)", file=sys.stderr)
        return 1
    print(f"check_links: {checked} relative links in {len(md_files)} Markdown files, all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
