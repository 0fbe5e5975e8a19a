#!/usr/bin/env python3
"""Draws which of dwarf's modules (src/*.c) use which, and names any cycle.
Run after make:

    python3 scripts/module-deps.py          # the edges, then "cycles: none"

Three kinds of use count:

  symbols   what each object file defines and uses (nm of src/*.o);
  inlines   a call of a static inline function of a header: it is the code
            of the module whose section of the header holds it (a header's
            sections start with a comment naming the file, "/* lend.c */";
            before the first, the header's own name: worker.h -> worker),
            and what its body uses is that module's use;
  state     a field of the worker's shared state (WorkerState in worker.h,
            the variable Worker): a field belongs to the module its comment
            names ("(lend.c)"), or, named by none, to the module that defines
            the variable (globals).  Reading or writing Worker.field uses
            that module.

The last two are why nm alone is not enough: a static inline function leaves
no symbol where it is called, and a shared struct hides who writes what.

Exits 1 if the modules depend on each other in a circle."""
import collections
import glob
import os
import re
import subprocess
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'src')


def module_of(path):
    return os.path.splitext(os.path.basename(path))[0]


def without_comments(text):
    """The text with C comments and string literals blanked out."""
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\])*"',
                  lambda m: ' ' if m.group(0).startswith('/') else '""', text, flags=re.S)


# ---- symbols -------------------------------------------------------------
defined = {}
used = collections.defaultdict(set)
for obj in sorted(glob.glob(os.path.join(root, '*.o'))):
    module = module_of(obj)
    for line in subprocess.run(['nm', obj], capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in 'TDBRC':
            defined[fields[2]] = module
        elif len(fields) == 2 and fields[0] == 'U':
            used[module].add(fields[1])
if not defined:
    sys.exit('module-deps: no src/*.o; run make first')

uses = collections.defaultdict(set)
why = {}                        # (from, to) -> the first thing seen that made the edge


def add_use(src, dst, reason):
    if dst != src and dst is not None:
        uses[src].add(dst)
        why.setdefault((src, dst), reason)


for module, symbols in used.items():
    for symbol in sorted(symbols):
        if symbol in defined:
            add_use(module, defined[symbol], symbol)

# ---- state: WorkerState's fields and their owners ------------------------
worker_h = open(os.path.join(root, 'worker.h')).read()
state_owner = {}
body = re.search(r'typedef struct WorkerState\s*\{(.*?)\}\s*WorkerState;', worker_h, re.S)
if body is None:
    sys.exit('module-deps: no WorkerState in src/worker.h')
state_home = defined.get('Worker')
# Each field: its declaration, then its comment (which may span lines).
for decl, comment in re.findall(r'([^;{}]*?\b\w+\s*(?:\[[^]]*\])?);[ \t]*(/\*.*?\*/)?', body.group(1), re.S):
    field = re.search(r'(\w+)\s*(?:\[[^]]*\])?$', decl.strip()).group(1)
    owner = re.search(r'\((\w+)\.c\)', comment or '')
    state_owner[field] = owner.group(1) if owner else state_home


def state_uses(module, code):
    for field in sorted(set(re.findall(r'\bWorker\s*\.\s*(\w+)', code))):
        add_use(module, state_owner.get(field, state_home), 'Worker.' + field)


# ---- inlines: static inline functions of headers -------------------------
inline_owner = {}
for header in sorted(glob.glob(os.path.join(root, '*.h'))):
    owner = module_of(header)
    text = open(header).read()
    pos = 0
    for m in re.finditer(r'/\*\s*(\w+)\.c\s*\*/|static\s+inline\b[^;{]*?\b(\w+)\s*\(', text):
        if m.group(1):
            owner = m.group(1)
            continue
        name = m.group(2)
        start = text.find('{', m.end())
        depth, end = 0, start
        while end < len(text):
            depth += {'{': 1, '}': -1}.get(text[end], 0)
            end += 1
            if depth == 0:
                break
        inline_owner[name] = owner
        code = without_comments(text[start:end])
        state_uses(owner, code)
        for symbol in sorted(set(re.findall(r'\b(\w+)\s*\(', code))):
            if symbol in defined:
                add_use(owner, defined[symbol], symbol)
        pos = end

for source in sorted(glob.glob(os.path.join(root, '*.c'))):
    module = module_of(source)
    code = without_comments(open(source).read())
    state_uses(module, code)
    for name, owner in inline_owner.items():
        if re.search(r'\b%s\s*\(' % re.escape(name), code):
            add_use(module, owner, name + '()')

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
if cycles:
    print('cycles:', '; '.join(' <-> '.join(c) for c in cycles))
    for c in cycles:
        members = set(c)
        for src in c:
            for dst in sorted(uses[src] & members):
                print(f'  {src} -> {dst}: {why[(src, dst)]}')
else:
    print('cycles: none')
sys.exit(1 if cycles else 0)
