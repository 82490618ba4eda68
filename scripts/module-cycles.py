#!/usr/bin/env python3
"""Prints the library's module graph and its import cycles.

Every `crate::a::b` path and `super::x` path in a file under src/ (the binary's main.rs aside)
is an edge from the file's module to the deepest module it names. Test code (a `#[cfg(test)]`
item and everything after it in the file, and every `tests.rs` file) is left out unless
--with-tests is given. Two graphs
are checked: top-level modules (`route`, `config`, ...) and every module (`route::lag`, ...).
Exit status 1 when either has a cycle.

--edges prints every edge; --between A B prints the edges between top-level modules A and B,
in either direction, and exits 1 when there is one (the two doors: --between resp http).

Usage: scripts/module-cycles.py [--with-tests] [--edges] [--between A B]
"""

import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, SRC)[: -len(".rs")].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return tuple(rel)


def strip(text, with_tests):
    text = re.sub(r"//[^\n]*", "", text)
    if not with_tests:
        at = text.find("#[cfg(test)]")
        if at >= 0:
            text = text[:at]
    return text


def main():
    with_tests = "--with-tests" in sys.argv
    files = {}
    for root, _, names in os.walk(SRC):
        for name in names:
            path = os.path.join(root, name)
            if name.endswith(".rs") and os.path.relpath(path, SRC) != "main.rs" and "bin" not in os.path.relpath(path, SRC).split(os.sep)[:1]:
                files[module_of(path)] = path
    modules = set(files)

    def resolve(parts):
        for end in range(len(parts), 0, -1):
            if tuple(parts[:end]) in modules:
                return tuple(parts[:end])
        return None

    edges = set()
    for module, path in files.items():
        # A `tests.rs` file is a test module (declared `#[cfg(test)] mod tests;` beside its
        # parent): test code as a whole.
        if not with_tests and module and module[-1] == "tests":
            continue
        text = strip(open(path, encoding="utf-8").read(), with_tests)
        # `use crate::x::{a, b}` groups name modules too: expand the first level of braces.
        for match in re.finditer(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)(::\{([^}]*)\})?", text):
            head = match.group(1)
            parts = [p for p in match.group(2).split("::") if p]
            if head == "crate":
                base = []
            else:
                # super:: from a file module is its parent; lib.rs has no parent.
                is_dir_module = os.path.basename(path) in ("mod.rs", "lib.rs")
                base = list(module if is_dir_module else module[:-1])
                base = base[:-1] if False else base
                if not is_dir_module:
                    pass
                else:
                    base = list(module[:-1])
            targets = [parts]
            if match.group(4):
                for item in match.group(4).split(","):
                    item = item.strip().split("::")
                    if item and item[0] and item[0] != "self":
                        targets.append(parts + item)
            for target in targets:
                found = resolve(base + target)
                if found and found != module and not (found == () or module[: len(found)] == found):
                    edges.add((module, found))

    def report(graph_edges, name):
        nodes = sorted({a for a, _ in graph_edges} | {b for _, b in graph_edges})
        succ = {n: set() for n in nodes}
        for a, b in graph_edges:
            if a != b:
                succ[a].add(b)
        # Tarjan's strongly connected components.
        index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in succ[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                scc = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    scc.append(w)
                    if w == v:
                        break
                if len(scc) > 1:
                    sccs.append(sorted(scc))

        sys.setrecursionlimit(10000)
        for v in nodes:
            if v not in index:
                visit(v)
        print(f"{name}: {len(nodes)} modules, {len(set(graph_edges))} edges, {len(sccs)} cycles")
        for scc in sccs:
            print("  cycle among:", ", ".join(sorted("::".join(m) or "crate" for m in scc)))
        if "--edges" in sys.argv:
            for a, b in sorted(set(graph_edges)):
                print("  ", "::".join(a), "->", "::".join(b))
        return len(sccs)

    if "--between" in sys.argv:
        at = sys.argv.index("--between")
        pair = set(sys.argv[at + 1 : at + 3])
        if len(pair) != 2:
            sys.exit("usage: --between A B (two different top-level modules)")
        between = sorted((a, b) for a, b in edges if {a[:1][0] if a else "", b[:1][0] if b else ""} == pair)
        print(f"edges between {' and '.join(sorted(pair))}: {len(between)}")
        for a, b in between:
            print("  ", "::".join(a), "->", "::".join(b))
        sys.exit(1 if between else 0)

    top = {(a[:1], b[:1]) for a, b in edges if a[:1] != b[:1]}
    cycles = report(top, "top-level modules" + (" (with tests)" if with_tests else ""))
    cycles += report(edges, "all modules" + (" (with tests)" if with_tests else ""))
    sys.exit(1 if cycles else 0)


if __name__ == "__main__":
    main()
