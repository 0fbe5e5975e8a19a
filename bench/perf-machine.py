# Where the whole machine's time goes during a load, from a system-wide perf
# profile: each sample is counted by process kind (pgbench, idle, a
# postgres process, or other: kernel threads, perf), by where it was (user space, a system call, named by
# its __x64_sys_ frame, a page fault, or other kernel work), and by the
# first of the FUNCS named that is on its stack, leaf first.  --under FUNC
# splits the samples whose stack holds FUNC by the frame just below it.
# (bench/perf-group.py groups a profile of the dwarf workers alone.)
#   perf record -a -g -F 2000 -o p.data -- sleep 4        (during the load)
#   perf script -i p.data -F comm,pid,ip,sym,dso > p.script
#   python3 bench/perf-machine.py p.script FUNC,FUNC,... [--under FUNC]...
import collections
import re
import sys


def read_samples(path):
    """Yields (comm, [frame symbol, leaf first]) for each sample."""
    comm, frames = None, None
    for line in open(path):
        line = line.rstrip('\n')
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm = None
        elif not line[0].isspace():
            if comm is not None:
                yield comm, frames
            comm, frames = line.split()[0], []
        elif comm is not None:
            m = re.match(r'\s+[0-9a-f]+ (\S+)', line)
            if m:
                frames.append(m.group(1))
    if comm is not None:
        yield comm, frames


def where(comm, frames):
    if comm == 'swapper':
        return 'idle'
    for f in frames:
        for prefix in ('__x64_sys_', '__do_sys_'):
            if f.startswith(prefix):
                return 'sys:' + f[len(prefix):]
    if 'exc_page_fault' in frames or 'asm_exc_page_fault' in frames:
        return 'page fault'
    if any(f.startswith('entry_SYSCALL') or f.startswith('asm_') or f.startswith('pvm_')
           for f in frames):
        return 'kernel, other'
    return 'user'


def main():
    path = sys.argv[1]
    funcs = sys.argv[2].split(',') if len(sys.argv) > 2 and not sys.argv[2].startswith('--') else []
    unders = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == '--under']
    by_where = collections.Counter()
    by_func = collections.Counter()
    below = {u: collections.Counter() for u in unders}
    n = 0
    for comm, frames in read_samples(path):
        n += 1
        kind = comm if comm in ('pgbench', 'swapper', 'postgres') else 'other'
        w = where(comm, frames)
        by_where[(kind, w)] += 1
        by_func[(kind, w, next((f for f in frames if f in funcs), '-'))] += 1
        for u in unders:
            if u in frames:
                i = frames.index(u)
                below[u][frames[i - 1] if i > 0 else '(self)'] += 1
    print('samples', n)
    print('\nby process and place:')
    for (kind, w), v in by_where.most_common(20):
        print('%6.2f%%  %-9s %s' % (100.0 * v / n, kind, w))
    if funcs:
        print('\nby process, place and the first of %s on the stack:' % ','.join(funcs))
        for (kind, w, f), v in by_func.most_common(30):
            print('%6.2f%%  %-9s %-16s %s' % (100.0 * v / n, kind, w, f))
    for u in unders:
        print('\nunder %s: %.2f%% of all samples' % (u, 100.0 * sum(below[u].values()) / n))
        for f, v in below[u].most_common(10):
            print('%6.2f%%  %s' % (100.0 * v / n, f))


main()
