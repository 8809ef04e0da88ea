#!/usr/bin/env python3
"""Checks that every program shown in the README and docs/*.md is one:
each fenced block whose info string is "c program" is extracted, compiled
against the built shared library with the flags of `pkg-config --cflags
--libs remat` (the build's uninstalled remat.pc) and -Wall -Wextra
-Werror, and run in a scratch directory with 2 worker threads; it must
exit 0 within 60 s (the programs check their own results and exit 1 when
one is wrong). The last lines each printed go to the log. Fails naming the page and line of each block that does not
compile or run, and when the pages hold no program at all.

usage: check_programs.py SOURCE_ROOT INCLUDE_DIR LIBREMAT_SO PC_DIR
Environment: CC, the compiler command; CHECK_FLAGS, flags for compiling
and linking (the build's sanitizers)."""
import os
import shlex
import subprocess
import sys
import tempfile
import time

OPEN = "```c program"


def programs(page):
    """(line, source) of each program block of a Markdown page."""
    out, block, start = [], None, 0
    with open(page, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if block is None and line.rstrip("\n") == OPEN:
                block, start = [], n
            elif block is not None and line.rstrip("\n") == "```":
                out.append((start, "".join(block)))
                block = None
            elif block is not None:
                block.append(line)
    if block is not None:
        out.append((start, None))  # never closed
    return out


def pkg_flags(pc_dir):
    env = dict(os.environ, PKG_CONFIG_PATH=pc_dir)
    r = subprocess.run(["pkg-config", "--cflags", "--libs", "remat-uninstalled"],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: pkg-config remat-uninstalled: {r.stderr}")
    return shlex.split(r.stdout)


def check(where, source, work, cc, flags, include_dir):
    """None when the program compiles and runs; else why not."""
    if source is None:
        return "the block is never closed"
    src, exe = os.path.join(work, "prog.c"), os.path.join(work, "prog")
    with open(src, "w", encoding="utf-8") as f:
        f.write(source)
    check_flags = shlex.split(os.environ.get("CHECK_FLAGS", ""))
    cmd = cc + check_flags + ["-std=c11", "-Wall", "-Wextra", "-Werror",
                              "-I" + include_dir, src] + flags + ["-o", exe]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return "does not compile:\n" + r.stderr
    lib_path = ":".join(f[2:] for f in flags if f.startswith("-L"))
    env = dict(os.environ, LD_LIBRARY_PATH=lib_path, REMAT_NUM_THREADS="2")
    try:
        r = subprocess.run([exe], cwd=work, env=env, capture_output=True,
                           text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "ran past 60 s"
    if r.returncode != 0:
        return f"exited {r.returncode}:\n{r.stdout}{r.stderr}"
    for line in r.stdout.splitlines()[-4:]:
        print("  | " + line)
    return None


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    root, include_dir, _, pc_dir = sys.argv[1:]
    docs = os.path.join(root, "docs")
    pages = [os.path.join(root, "README.md")] + sorted(
        os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    cc = shlex.split(os.environ.get("CC", "cc"))
    flags = pkg_flags(pc_dir)
    bad, count = 0, 0
    for page in pages:
        for line, source in programs(page):
            count += 1
            where = f"{os.path.relpath(page, root)}:{line}"
            with tempfile.TemporaryDirectory(prefix="remat-programs-") as work:
                start = time.monotonic()
                why = check(where, source, work, cc, flags, include_dir)
            if why is None:
                print(f"ok: {where}: compiled and ran in "
                      f"{time.monotonic() - start:.1f} s")
            else:
                bad += 1
                print(f"FAIL: {where}: {why}")
    if count == 0:
        print("FAIL: no ```c program block in README.md or docs/*.md")
        return 1
    print(f"{count} programs, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
