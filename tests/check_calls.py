#!/usr/bin/env python3
"""Checks the library's call structure, and fails naming what breaks it:
- no source file calls back into a file that calls it: the file-level call
  graph from the object files' defined and undefined symbols (nm) has no
  cycle;
- runtime/compile/ uses no symbol of runtime/exec/ (compile builds the
  compiled step; running it is exec's);
- outside runtime/compile/, no declaration takes a `compiled_step *` that is
  not const: the compiled step cannot change once compile returns.

usage: check_calls.py OBJECT_DIR SOURCE_ROOT (the library's .p folder in a
build, and the repository it was built from)"""
import os
import re
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True,
                         check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRC":
            defined.add(parts[2])
    return defined, undefined


def find_cycles(edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return comps


def source_names(root):
    """Object file name (meson's: the path with '/' as '_', then '.o') ->
    the source file's path from the repository root."""
    names = {}
    for top in ("base", "ops", "sched", "runtime"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(".c"):
                    rel = os.path.relpath(os.path.join(d, f), root)
                    names[rel.replace("/", "_") + ".o"] = rel[:-len(".c")]
    return names


def layer_breaks(needs, owner):
    """(file, symbol, owner) for each runtime/compile/ file's use of a
    runtime/exec/ symbol."""
    out = []
    for f, undefined in sorted(needs.items()):
        if not f.startswith("runtime/compile/"):
            continue
        for s in sorted(undefined):
            if owner.get(s, "").startswith("runtime/exec/"):
                out.append((f, s, owner[s]))
    return out


MUTABLE = re.compile(r"(?<!const )\bcompiled_step\s*\*")


def mutable_compiled(root):
    """file:line of each `compiled_step *` without const in runtime/ outside
    runtime/compile/."""
    out = []
    for d, _, files in os.walk(os.path.join(root, "runtime")):
        rel_dir = os.path.relpath(d, root)
        if rel_dir.startswith("runtime/compile"):
            continue
        for f in sorted(files):
            if not f.endswith((".c", ".h")):
                continue
            path = os.path.join(d, f)
            with open(path, encoding="utf-8") as src:
                for n, line in enumerate(src, 1):
                    if MUTABLE.search(line):
                        out.append(f"{os.path.join(rel_dir, f)}:{n}")
    return out


def main():
    folder, root = sys.argv[1], sys.argv[2]
    objs = sorted(f for f in os.listdir(folder) if f.endswith(".o"))
    if not objs:
        print(f"no object files in {folder}")
        return 1
    names = source_names(root)
    owner, needs = {}, {}
    for o in objs:
        if o not in names:
            print(f"{o}: no source file under {root} has this object's name")
            return 1
        name = names[o]
        defined, undefined = symbols(os.path.join(folder, o))
        for s in defined:
            owner[s] = name
        needs[name] = undefined
    edges = {f: {owner[s] for s in u if s in owner and owner[s] != f}
             for f, u in needs.items()}
    cycles = find_cycles(edges)
    for c in cycles:
        print("files that call each other: " + " <-> ".join(c))
    layer = layer_breaks(needs, owner)
    for f, s, o in layer:
        print(f"{f} uses {s} of {o}: runtime/compile/ must not use "
              f"runtime/exec/")
    writes = mutable_compiled(root)
    for w in writes:
        print(f"{w}: a compiled_step pointer without const outside "
              f"runtime/compile/")
    print(f"{len(objs)} files, {sum(len(e) for e in edges.values())} "
          f"call edges, {len(cycles)} cycles, {len(layer)} compile->exec "
          f"uses, {len(writes)} mutable compiled steps")
    return 1 if cycles or layer or writes else 0


if __name__ == "__main__":
    sys.exit(main())
