#!/usr/bin/env python3
"""Checks the project's Markdown pages (README.md, CHANGELOG.md, docs/*.md):
every relative link and image points at a file that exists, every link to
a heading of a page (#anchor) names a heading that page has, and every
page in docs/ is linked from the README. Fails naming each broken link.

usage: check_links.py SOURCE_ROOT"""
import os
import re
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
DOCS_NAME = re.compile(r"(?<![\w./-])docs/[\w.-]+\.md\b")


def slug(heading):
    """The anchor a heading gets (GitHub's rule: lower case, punctuation
    dropped, spaces to dashes)."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    out = set()
    inside = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                inside = not inside
            elif not inside and line.startswith("#"):
                out.add(slug(line.lstrip("#")))
    return out


def links(path):
    inside = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.startswith("```"):
                inside = not inside
                continue
            if not inside:
                for m in LINK.finditer(line):
                    yield n, m.group(1)


def check_page(root, page):
    bad = []
    base = os.path.dirname(page)
    for n, target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # a URL, not checked here
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(base, file)) if file else page
        where = f"{os.path.relpath(page, root)}:{n}: '{target}'"
        if not os.path.exists(dest):
            bad.append(f"{where}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            bad.append(f"{where}: no heading with that anchor")
    return bad


def named_pages(root, page):
    """Each docs/*.md that the page names anywhere, with its line, that
    does not exist."""
    bad = []
    with open(page, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            for name in DOCS_NAME.findall(line):
                if not os.path.exists(os.path.join(root, name)):
                    bad.append(f"{os.path.relpath(page, root)}:{n}: names "
                               f"{name}, which does not exist")
    return bad


def main():
    root = sys.argv[1]
    docs = os.path.join(root, "docs")
    pages = [os.path.join(root, "README.md"), os.path.join(root, "CHANGELOG.md")]
    pages += sorted(os.path.join(docs, f) for f in os.listdir(docs)
                    if f.endswith(".md"))
    bad = []
    for page in pages:
        bad += check_page(root, page) + named_pages(root, page)
    readme_targets = {os.path.normpath(os.path.join(root, t.partition("#")[0]))
                      for _, t in links(pages[0])}
    for page in pages[2:]:
        if os.path.normpath(page) not in readme_targets:
            bad.append(f"README.md: does not link {os.path.relpath(page, root)}")
    for b in bad:
        print(b)
    print(f"{len(pages)} pages, {len(bad)} broken links")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
