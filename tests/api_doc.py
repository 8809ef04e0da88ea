#!/usr/bin/env python3
"""Generates docs/api.md from the public headers (include/remat.h,
remat_gpt.h, remat_llama.h, remat_lora.h, remat_mpi.h), whose comments are the contracts: each header
in its order, under its own sections ("---- graph building ----"), every
declaration with the comment above it, every REMAT_API function under a
heading of its name. Checks (the default) that docs/api.md is what the
headers give, naming each function that the page lacks or has too many;
with --write, writes it.

usage: api_doc.py SOURCE_ROOT [--write]"""
import os
import re
import sys

HEADERS = [("remat.h", "the runtime, graphs and ops, policies, compile and "
            "steps, saving and loading"),
           ("remat_gpt.h", "the built-in GPT model"),
           ("remat_llama.h", "the built-in Llama-family model"),
           ("remat_lora.h", "LoRA adapters and PEFT's adapter files"),
           ("remat_mpi.h", "data parallel over MPI, in libremat_mpi "
            "(`pkg-config --cflags --libs remat_mpi`)")]
SECTION = re.compile(r"^/\* ---- (.*) ---- \*/$")
FUNCTION = re.compile(r"\b(remat_\w+)\s*\(")
DECL_START = ("REMAT_API", "typedef", "#define")


def read_comment(lines, i):
    """The comment starting at line i: (its lines, the next line's index)."""
    out = []
    while True:
        out.append(lines[i])
        if "*/" in lines[i]:
            return out, i + 1
        i += 1


def read_decl(lines, i):
    """The declaration starting at line i: (its lines, the next index)."""
    out = [lines[i]]
    first = lines[i]
    if first.startswith("#define"):
        while out[-1].endswith("\\"):
            i += 1
            out.append(lines[i])
        return out, i + 1
    if first.startswith("typedef") and "{" in first:
        while not re.match(r"^}.*;", out[-1]):
            i += 1
            out.append(lines[i])
        return out, i + 1
    while ";" not in re.sub(r"/\*.*?\*/", "", out[-1]):
        i += 1
        out.append(lines[i])
    return out, i + 1


def items(path):
    """The header as ('intro', text), ('section', title) and ('item',
    comment lines, declaration lines) in order."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i, first, skip_depth = 0, True, 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"#ifndef REMAT\w*_H$", line) or (
                line.startswith("#endif") and not skip_depth):
            i += 1  # the include guard
            continue
        if skip_depth or line.startswith("#if"):
            if line.startswith("#if"):
                skip_depth += 1
            elif line.startswith("#endif"):
                skip_depth -= 1
            i += 1
            continue
        if line.startswith("/*"):
            comment, i = read_comment(lines, i)
            m = SECTION.match(line)
            if m:
                yield ("section", m.group(1))
            elif first:
                yield ("intro", comment)
            elif i < len(lines) and lines[i].startswith(DECL_START):
                decl = []
                while i < len(lines) and lines[i].startswith(DECL_START):
                    part, i = read_decl(lines, i)
                    decl += part
                yield ("item", comment, decl)
            else:
                yield ("item", comment, [])
            first = False
            continue
        if line.startswith(DECL_START) and not re.match(
                r"#define REMAT(_GPT|_MPI)?_H$", line):
            decl = []
            while i < len(lines) and lines[i].startswith(DECL_START):
                part, i = read_decl(lines, i)
                decl += part
            yield ("item", [], decl)
            continue
        i += 1


def comment_text(comment):
    """A C comment's words, one line each, without /*, * and */."""
    out = []
    for line in comment:
        line = line.strip()
        line = re.sub(r"^/\*+ ?", "", line)
        line = re.sub(r"\s*\*/$", "", line)
        line = re.sub(r"^\* ?", "", line)
        out.append(line)
    return "\n".join(out).strip()


def functions_of(decl):
    """The REMAT_API functions a declaration declares."""
    text = " ".join(decl)
    return [m.group(1) for part in text.split("REMAT_API")[1:]
            for m in [FUNCTION.search(part)] if m]


def generate(root):
    out = ["# API reference", "",
           "Generated from the public headers by `tests/api_doc.py` (run "
           "`python3 tests/api_doc.py . --write` after changing a header; "
           "the test `check_api_doc` fails while this page differs from "
           "them). Each declaration comes with the comment above it in the "
           "header, which is its contract. The [tutorial](tutorial.md) "
           "shows the calls at work.", ""]
    for name, what in HEADERS:
        out.append(f"- [`{name}`](#{name.replace('.', '')}): {what}")
    out.append("")
    names = []
    for name, _ in HEADERS:
        out += [f"## {name}", ""]
        for item in items(os.path.join(root, "include", name)):
            if item[0] == "intro":
                out += [comment_text(item[1]), ""]
            elif item[0] == "section":
                out += [f"### {item[1][0].upper()}{item[1][1:]}", ""]
            else:
                comment, decl = item[1], item[2]
                funcs = functions_of(decl)
                names += funcs
                if funcs:
                    out += ["#### " + ", ".join(f"`{f}`" for f in funcs), ""]
                out.append("```c")
                out += [line.rstrip() for line in comment + decl]
                out += ["```", ""]
    return "\n".join(out).rstrip() + "\n", names


def main():
    root = sys.argv[1]
    page = os.path.join(root, "docs", "api.md")
    text, names = generate(root)
    if "--write" in sys.argv[2:]:
        with open(page, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {page}: {len(names)} functions")
        return 0
    try:
        with open(page, encoding="utf-8") as f:
            have = f.read()
    except OSError as e:
        print(f"FAIL: {e}")
        return 1
    listed = set(re.findall(r"^#### (.*)$", have, re.M))
    listed = {n for line in listed for n in re.findall(r"`(remat_\w+)`", line)}
    missing = [n for n in names if n not in listed]
    extra = sorted(listed - set(names))
    for n in missing:
        print(f"FAIL: docs/api.md lacks {n} (declared REMAT_API in include/)")
    for n in extra:
        print(f"FAIL: docs/api.md documents {n}, which no header declares")
    if have != text and not missing and not extra:
        print("FAIL: docs/api.md differs from what the headers' comments give")
    if have != text:
        print("run: python3 tests/api_doc.py . --write")
        return 1
    print(f"ok: docs/api.md documents the {len(names)} REMAT_API functions "
          "as the headers do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
