#!/usr/bin/env python3
"""Draws which of dwarf's modules (src/*.o) use which, from the symbols each
object file defines and uses (nm), and names any cycle.  Run after make:

    python3 scripts/module-deps.py          # the edges, then "cycles: none"

Exits 1 if the modules depend on each other in a circle."""
import collections
import glob
import os
import subprocess
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'src')
defined = {}
used = collections.defaultdict(set)
for obj in sorted(glob.glob(os.path.join(root, '*.o'))):
    module = os.path.basename(obj)[:-2]
    for line in subprocess.run(['nm', obj], capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in 'TDBRC':
            defined[fields[2]] = module
        elif len(fields) == 2 and fields[0] == 'U':
            used[module].add(fields[1])
if not defined:
    sys.exit('module-deps: no src/*.o; run make first')

uses = collections.defaultdict(set)
for module, symbols in used.items():
    for symbol in symbols:
        if symbol in defined and defined[symbol] != module:
            uses[module].add(defined[symbol])
for module in sorted(uses):
    print(f'{module} -> {" ".join(sorted(uses[module]))}')

# Tarjan's strongly connected components: each of more than one module is a cycle.
index, low, stack, on_stack, cycles = {}, {}, [], set(), []


def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in uses.get(v, ()):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on_stack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        component = []
        while True:
            w = stack.pop()
            on_stack.discard(w)
            component.append(w)
            if w == v:
                break
        if len(component) > 1:
            cycles.append(sorted(component))


for module in sorted(uses):
    if module not in index:
        visit(module)
print('cycles:', '; '.join(' <-> '.join(c) for c in cycles) if cycles else 'none')
sys.exit(1 if cycles else 0)
