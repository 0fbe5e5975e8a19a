# Copyright: dwarf project.
#
# 060_poison_and_refusals.pl: mishaps that must not wedge the engine.
#
#  1. A poison step: a task that ends its own worker (pg_terminate_backend of
#     itself) fails after dwarf.step_crashes tries with an error that says so,
#     and the other flows of that worker complete meanwhile.
#  2. The same for a task whose process dies of a signal (SIGSEGV), which
#     makes the postmaster restart every process: the count survives that.
#  3. PREPARE TRANSACTION after dwarf.create is refused with a clear error.
#  4. CREATE EXTENSION dwarf on a server that does not preload it is a clear
#     error, and the session goes on (it was a FATAL).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $t0   = time;
my $node = new_node('poison', max_prepared_transactions => 2);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION app.suicide(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT pg_terminate_backend(pg_backend_pid()); SELECT '{}'::jsonb $$;
CREATE FUNCTION app.segfault(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	COPY (SELECT 1) TO PROGRAM 'kill -SEGV $PPID';
	RETURN '{}';
END $$;
SELECT dwarf.define('suicide', '{"tasks": {"K": "app.suicide"}}');
SELECT dwarf.define('segfault', '{"tasks": {"K": "app.segfault"}}');
SELECT dwarf.define('quick', '{"tasks": {"A": "app.noop", "B": "app.noop"},
  "transitions": [{"from": "A", "to": "B"}]}');
});
wait_for_workers($node, 'two workers run');

# ---------------------------------------------------------------- 1. terminate
$node->safe_psql('postgres', q{
CREATE TABLE ids (what text, id bigint);
BEGIN;
INSERT INTO ids SELECT 'poison', dwarf.create('suicide', '{}');
INSERT INTO ids SELECT 'quick', dwarf.create('quick', '{}') FROM generate_series(1, 40);
COMMIT;
});
$node->poll_query_until('postgres', q{
SELECT count(*) = 0 FROM dwarf.flow WHERE status = 'running'}) or diag('flows still running');
like($node->safe_psql('postgres', q{
SELECT status || ': ' || error FROM dwarf.flow WHERE id = (SELECT id FROM ids WHERE what = 'poison')}),
	qr/^failed: task "K" ended the process running it 3 times; it is not run again$/,
	'the step that ends its worker fails after three tries, and says so');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM dwarf.flow WHERE id IN (SELECT id FROM ids WHERE what = 'quick')
   AND status = 'completed'}), '40', 'every other flow completed');
like(slurp_file($node->logfile), qr/a step of flow \d+ ended the process running it \(1 time\)/,
	'the server log names the flow whose step ended its worker');

# ---------------------------------------------------------------- 2. signal
my $seg = $node->safe_psql('postgres', q{SELECT dwarf.create('segfault', '{}')});
$node->poll_query_until('postgres', qq{
SELECT status <> 'running' FROM dwarf.flow WHERE id = $seg}) or diag('the segfault flow still runs');
like($node->safe_psql('postgres', qq{SELECT status || ': ' || error FROM dwarf.flow WHERE id = $seg}),
	qr/^failed: task "K" ended the process running it 3 times/,
	'a step whose process dies of a signal fails after three tries, across crash restarts');
is($node->safe_psql('postgres', q{SELECT status FROM dwarf.run('quick', '{}', timeout => '30 s')}),
	'completed', 'a new flow completes after the crashes');

# ---------------------------------------------------------------- 3. prepare
my ($rc, $out, $err) = $node->psql('postgres', q{
BEGIN;
SELECT dwarf.create('quick', '{}');
PREPARE TRANSACTION 'p1';
});
like($err, qr/cannot PREPARE a transaction that created, cancelled, resumed or deleted dwarf flows/,
	'PREPARE TRANSACTION after dwarf.create is refused');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_prepared_xacts}), '0',
	'and nothing was prepared');
stop_node($node, $t0);

# ---------------------------------------------------------------- 4. no preload
my $plain = PostgreSQL::Test::Cluster->new('no_preload');
$plain->init;
$plain->start;
($rc, $out, $err) = $plain->psql('postgres', q{
CREATE EXTENSION dwarf;
SELECT 'still here';
}, on_error_stop => 0);
like($err, qr/ERROR:  dwarf must be loaded by shared_preload_libraries/,
	'CREATE EXTENSION without shared_preload_libraries: a clear error');
is($out, 'still here', 'the session goes on');
unlike(slurp_file($plain->logfile), qr/FATAL/, 'no FATAL in the server log');
$plain->stop;

done_testing();
