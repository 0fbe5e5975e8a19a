#!/usr/bin/env python3
"""Run every ```sql block of README.md, as written, top to bottom.

    scripts/readme-sql.py [--bindir DIR] [--workdir DIR] [--keep] [README.md]

Run as the postgres user (initdb refuses root).  It makes a throwaway cluster
in WORKDIR that preloads dwarf and pg_cron (what README.md tells a reader to
set), creates a fresh database "readme", and runs the blocks there in ONE psql
session, in the order they appear:

- A statement error fails the test (psql stops there, as ON_ERROR_STOP does),
  unless its block contains the line "-- fails": such a block must raise at
  least one error, and the session goes on after it.
- A block whose first line is "-- not run: <why>" (one that needs other
  servers, a crash or a restart) is skipped; the skipped blocks are listed.

psql reads a file with the README's own line numbers (every line outside a
run block is blank), so each error psql reports names the README line it came
from.  The whole output of the session is kept in WORKDIR/psql.out, which is
also how to see a block's real output when writing it into the README.

The last line is "readme: N blocks passed, M failed, K skipped"; the exit
status is 0 only when M is 0.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

OPEN = re.compile(r'^(\s*)```sql\s*$')
FENCE = re.compile(r'^\s*```')
# psql names the input line of everything it reports; all but these levels
# are errors (a server's ERROR or FATAL, or psql's own: "no rows returned
# for \gset", an invalid command).
MESSAGE = re.compile(r'^psql:README\.md:(?P<line>\d+): (?P<msg>.*)$')
NOT_ERROR = re.compile(r'^(NOTICE|WARNING|INFO|LOG|DEBUG\d?):')
FAILS = re.compile(r'^\s*--\s*fails\b')
NOT_RUN = re.compile(r'^\s*--\s*not run:\s*(?P<why>.+)$')
DATABASE = 'readme'
PORT = 55433  # names the socket only: the server listens on no TCP port
PSQL_TIMEOUT = 300


class Block:
    """One ```sql block: README lines first..last hold its text (the fences
    are first - 1 and last + 1)."""

    def __init__(self, first, lines):
        self.first = first
        self.last = first + len(lines) - 1
        self.lines = lines
        self.fails = any(FAILS.match(l) for l in lines)
        m = NOT_RUN.match(lines[0]) if lines else None
        self.skip = m.group('why').strip() if m else None
        self.errors = []

    def where(self):
        return 'README.md:%d (the ```sql block of lines %d-%d)' % (
            self.first - 1, self.first - 1, self.last + 1)


def parse(path):
    """The README's lines and its ```sql blocks, with indentation removed
    (a block may sit in a list item)."""
    with open(path, encoding='utf-8') as f:
        text = f.read().split('\n')
    blocks = []
    i = 0
    while i < len(text):
        m = OPEN.match(text[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        j = i + 1
        while j < len(text) and not FENCE.match(text[j]):
            j += 1
        if j == len(text):
            sys.exit('readme-sql: README.md:%d: ```sql block is never closed' % (i + 1))
        body = [l[indent:] if l[:indent].strip() == '' else l for l in text[i + 1:j]]
        blocks.append(Block(i + 2, body))
        i = j + 1
    return text, blocks


def unterminated(block):
    """True when the block's last statement has no ';' (it would run on into
    the next block, so the README would not show what runs)."""
    for line in reversed(block.lines):
        code = re.sub(r'--.*$', '', line).strip()
        if not code:
            continue
        return not (code.endswith(';') or code.startswith('\\') or re.search(r'\\g\w*', code))
    return False


def script(text, blocks):
    """The psql input: the README's line count, each run block's text on its
    own lines, and on each opening fence line whether an error stops psql."""
    out = [''] * len(text)
    for b in blocks:
        if b.skip:
            continue
        out[b.first - 2] = '\\set ON_ERROR_STOP %d' % (0 if b.fails else 1)
        for k, line in enumerate(b.lines):
            out[b.first - 1 + k] = line
    return '\n'.join(out) + '\n'


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, **kw)


def main():
    ap = argparse.ArgumentParser(description='Run the ```sql blocks of README.md.')
    ap.add_argument('readme', nargs='?', default=os.path.join(os.path.dirname(__file__), '..', 'README.md'))
    ap.add_argument('--bindir', default='/usr/lib/postgresql/15/bin')
    ap.add_argument('--workdir', help='a new or empty directory for the cluster (default: a temporary one)')
    ap.add_argument('--keep', action='store_true', help='keep WORKDIR even when every block passed')
    args = ap.parse_args()

    text, blocks = parse(args.readme)
    bad = [b for b in blocks if not b.skip and unterminated(b)]
    for b in bad:
        print('readme-sql: %s: its last statement does not end with ";"' % b.where())
    if bad:
        print('readme: 0 blocks passed, %d failed, 0 skipped' % len(bad))
        return 1

    work = args.workdir or tempfile.mkdtemp(prefix='readme-sql.', dir='/var/tmp')
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, 'data')
    sqlfile = os.path.join(work, 'README.md.sql')
    outfile = os.path.join(work, 'psql.out')
    with open(sqlfile, 'w', encoding='utf-8') as f:
        f.write(script(text, blocks))

    bindir = args.bindir
    started = False
    ok = False
    try:
        run([os.path.join(bindir, 'initdb'), '-D', data, '-A', 'trust', '-E', 'UTF8', '--no-sync'])
        with open(os.path.join(data, 'postgresql.conf'), 'a') as f:
            f.write('\n'.join([
                '',
                "port = %d" % PORT,
                "listen_addresses = ''",
                "unix_socket_directories = '%s'" % work,
                "fsync = off",
                # What README.md tells a reader to set:
                "shared_preload_libraries = 'dwarf, pg_cron'",
                "cron.database_name = '%s'" % DATABASE,
                "cron.use_background_workers = on",
                "max_worker_processes = 32",
                '']))
        run([os.path.join(bindir, 'pg_ctl'), '-D', data, '-l', os.path.join(work, 'server.log'),
             '-w', '-t', '60', 'start'])
        started = True
        run([os.path.join(bindir, 'createdb'), '-h', work, '-p', str(PORT), DATABASE])
        run([os.path.join(bindir, 'psql'), '-X', '-q', '-h', work, '-p', str(PORT), '-d', DATABASE,
             '-c', 'CREATE EXTENSION dwarf'])

        env = dict(os.environ, PGOPTIONS='-c statement_timeout=120s')
        timed_out = False
        try:
            p = subprocess.run([os.path.join(bindir, 'psql'), '-X', '-e', '-h', work, '-p', str(PORT),
                                '-d', DATABASE, '-f', sqlfile],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True, timeout=PSQL_TIMEOUT, env=env)
            output, status = p.stdout, p.returncode
        except subprocess.TimeoutExpired as e:
            output = e.stdout or ''
            if isinstance(output, bytes):
                output = output.decode('utf-8', 'replace')
            status, timed_out = None, True
        output = output.replace('psql:%s:' % sqlfile, 'psql:README.md:')
        with open(outfile, 'w', encoding='utf-8') as f:
            f.write(output)

        # Which block each error came from.
        stray = []
        for line in output.split('\n'):
            m = MESSAGE.match(line)
            if not m or NOT_ERROR.match(m.group('msg')):
                continue
            n = int(m.group('line'))
            hit = [b for b in blocks if not b.skip and b.first - 1 <= n <= b.last + 1]
            if hit:
                hit[0].errors.append((n, m.group('msg')))
            else:
                stray.append(line)

        ran = [b for b in blocks if not b.skip]
        problems = []
        not_reached = []
        stopped = False
        for b in ran:
            if stopped:
                not_reached.append(b)  # psql stopped at an earlier block
            elif b.fails:
                if not b.errors:
                    problems.append('%s is marked "-- fails" but raised no error' % b.where())
            elif b.errors:
                n, msg = b.errors[0]
                problems.append('README.md:%d: %s\n    in %s' % (n, msg, b.where()))
                stopped = True
        for line in stray:
            problems.append('an error outside any block: %s' % line)
        if timed_out:
            problems.append('psql did not finish within %d s (see %s for where it was)' % (PSQL_TIMEOUT, outfile))
        elif status != 0 and not problems:
            problems.append('psql exited with status %d' % status)

        failed = {id(b) for b in ran if (b.fails and not b.errors) or (not b.fails and b.errors)}
        failed |= {id(b) for b in not_reached}
        if timed_out or (status != 0 and not failed):
            failed.add(id(ran[-1]) if ran else 0)
        skipped = [b for b in blocks if b.skip]

        print('readme-sql: %d ```sql blocks in %s; %d run in one psql session, %d skipped'
              % (len(blocks), args.readme, len(ran), len(skipped)))
        for b in skipped:
            print('  skipped README.md:%d: %s' % (b.first - 1, b.skip))
        expected = sum(len(b.errors) for b in ran if b.fails)
        print('  errors expected by "-- fails" blocks and raised: %d' % expected)
        for p_ in problems:
            print('FAILED: ' + p_)
        if not_reached:
            print('  not run after the error: %d block(s), from README.md:%d' % (
                len(not_reached), not_reached[0].first - 1))
        if problems:
            print('----- psql output (last 60 lines; all of it in %s) -----' % outfile)
            print('\n'.join(output.rstrip('\n').split('\n')[-60:]))
            print('----- end of psql output -----')
        nfail = len(failed)
        print('readme: %d blocks passed, %d failed, %d skipped' % (len(ran) - nfail, nfail, len(skipped)))
        ok = not problems
        return 0 if ok else 1
    except subprocess.CalledProcessError as e:
        print('readme-sql: %s failed (status %d):\n%s' % (' '.join(e.cmd), e.returncode, e.stdout))
        log = os.path.join(work, 'server.log')
        if os.path.exists(log):
            with open(log) as f:
                print(f.read()[-4000:])
        print('readme: 0 blocks passed, 1 failed, 0 skipped')
        return 1
    finally:
        if started:
            subprocess.run([os.path.join(bindir, 'pg_ctl'), '-D', data, '-m', 'fast', '-w', '-t', '60', 'stop'],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if ok and not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        elif not ok or args.keep:
            print('readme-sql: cluster and psql output kept in %s' % work)


if __name__ == '__main__':
    sys.exit(main())
