# Copyright: dwarf project.
#
# 176_sleepers_out_of_memory.pl: flows that sleep long, or wait for
# dwarf.resume, are not held in a worker's memory; they are loaded again
# when due (or resumed), and a restart does not load them all either.
#
#  1. 100,000 flows that sleep an hour, beside three that sleep 8 s (past
#     the 5 s after which a sleeping flow leaves memory), one interrupted
#     flow and one more sleeper: the workers' private memory grows by less
#     than BOUND_MB.  The short sleepers wake (none early) and complete; the
#     interrupted flow, resumed, completes with the resume's data; the
#     sleeper, cancelled, ends cancelled and never wakes.
#  2. Three more short sleepers and one more interrupted flow, then an
#     orderly restart: the workers' memory still grows by less than
#     BOUND_MB over a fresh start, and those flows complete as in 1.
#
# Memory is the sum over the dwarf workers of RssAnon from /proc/PID/status
# (their private memory: VmRSS would count the shared buffers they read).
# Measured on this machine: the code before the change held each sleeping
# flow in memory: 100,000 flows grew the workers by 513 MB, and by 1,023 MB
# after a restart (every flow loaded and replayed at once).  With the change
# they grew by 30 MB, and by 36 MB after a restart (memory the allocator
# keeps after a burst; the memory contexts hold ~3 MB a worker, the
# sleepers' 16-byte timer entries among it).  BOUND_MB, 128, leaves room
# for the allocator and a loaded machine, and is a quarter of the old.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $BOUND_MB = 128;
my $N        = 100_000;

my $t0   = time;
my $node = new_node('sleepers');

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA nap;
CREATE FUNCTION nap.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep(make_interval(secs => (s->>'secs')::float8)); RETURN '{}'; END $$;
CREATE FUNCTION nap.woke(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"woke": true}'::jsonb $$;
CREATE FUNCTION nap.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE answer jsonb := dwarf.interrupt('{"q": "go on?"}');
BEGIN RETURN jsonb_build_object('answer', answer); END $$;
SELECT dwarf.define('nap', '{"tasks": {"Nap": "nap.nap", "Woke": "nap.woke"},
  "transitions": [{"from": "Nap", "to": "Woke"}]}');
SELECT dwarf.define('ask', '{"tasks": {"Ask": "nap.ask"}, "transitions": []}');
});
wait_for_workers($node, 'two workers run');

# The dwarf workers' RssAnon, in kB, summed.
sub workers_kb
{
	my $kb = 0;
	foreach my $pid (split /\n/, $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'"))
	{
		my ($v) = slurp_file("/proc/$pid/status") =~ /^RssAnon:\s+(\d+) kB/m;
		$kb += $v;
	}
	return $kb;
}

# Short sleepers, an interrupted flow and a sleeper to cancel: their ids.
sub create_few
{
	my $ids = $node->safe_psql('postgres', q{
SELECT string_agg(dwarf.create('nap', '{"secs": 8}')::text, ',') FROM generate_series(1, 3);
SELECT dwarf.create('ask', '{}');
SELECT dwarf.create('nap', '{"secs": 3600}');});
	my ($short, $ask, $long) = split /\n/, $ids;
	return ($short, $ask, $long);
}

# Waits until flow $id has taken $n steps.
sub wait_steps
{
	my ($id, $n, $message) = @_;
	ok($node->poll_query_until('postgres',
		"SELECT count(*) >= $n FROM dwarf.step WHERE flow_id = $id"), $message);
}

# The short sleepers completed, none woke before its 8 s were up; the
# interrupted flow, resumed, completed with the data given.
sub check_few
{
	my ($short, $ask, $when) = @_;
	ok($node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE id IN ($short) AND status = 'completed'", '3'),
		"the three 8 s sleepers completed $when");
	is($node->safe_psql('postgres', qq{
SELECT count(*) FROM dwarf.step n JOIN dwarf.step w ON w.flow_id = n.flow_id AND w.task = 'Woke'
 WHERE n.flow_id IN ($short) AND n.task = 'Nap' AND w.started_at >= n.wake_at}),
		'3', "none woke before its wake time $when");
	is($node->safe_psql('postgres',
		"SELECT status FROM dwarf.await($ask, '0 s')"), 'interrupted',
		"the interrupted flow is interrupted $when");
	$node->safe_psql('postgres', "SELECT dwarf.resume($ask, '\"yes\"')");
	is($node->safe_psql('postgres', qq{
SET statement_timeout = '120 s';
SELECT status || ' ' || (state->>'answer') FROM dwarf.await($ask, '100 s')}),
		'completed yes', "the interrupted flow, resumed, completed with the data $when");
}

my $base = workers_kb();
note("workers' RssAnon before any sleeper: $base kB");

# ---------------------------------------------------------------- 1. asleep
$node->safe_psql('postgres',
	"SELECT count(dwarf.create('nap', '{\"secs\": 3600}')) FROM generate_series(1, $N / 2)")
  for 1 .. 2;
my ($short, $ask, $long) = create_few();
ok($node->poll_query_until('postgres',
	"SELECT count(*) >= $N + 5 FROM dwarf.step"), 'every flow took its first step')
  or diag $node->safe_psql('postgres', 'SELECT running, steps_done, workers FROM dwarf.stats');
my $asleep = workers_kb();
note("workers' RssAnon with $N flows asleep: $asleep kB");
cmp_ok(($asleep - $base) / 1024, '<', $BOUND_MB,
	"$N sleeping flows grew the workers by less than $BOUND_MB MB");

check_few($short, $ask, 'while 100,000 sleep');
is($node->safe_psql('postgres', "SELECT dwarf.cancel($long, 'not needed')"), 't',
	'a sleeper out of memory is cancelled');
is($node->safe_psql('postgres', qq{
SET statement_timeout = '120 s';
SELECT status || ' ' || cancel_reason FROM dwarf.await($long, '100 s')}),
	'cancelled not needed', 'it ends cancelled');

# ---------------------------------------------------------------- 2. restart
($short, $ask, $long) = create_few();
wait_steps($ask, 1, 'the second interrupted flow parked');
$node->restart;
wait_for_workers($node, 'two workers run again');
check_few($short, $ask, 'after a restart');
{
	# The workers scanned their flows before the short sleepers woke.
	my $restarted = workers_kb();
	note("workers' RssAnon with $N flows asleep, after a restart: $restarted kB");
	cmp_ok(($restarted - $base) / 1024, '<', $BOUND_MB,
		"after a restart, the workers are still within $BOUND_MB MB");
}
is($node->safe_psql('postgres', qq{
SELECT count(*) FROM dwarf.flow WHERE status = 'running'}),
	$N + 1, 'the long sleepers still sleep')
  or diag $node->safe_psql('postgres', q{
SELECT status, count(*), min(error), min(cancel_reason) FROM dwarf.flow GROUP BY 1;
SELECT s.task, s.status, count(*) FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id
 WHERE f.status <> 'running' GROUP BY 1, 2});
is($node->safe_psql('postgres', qq{
SELECT count(*) FROM dwarf.step WHERE flow_id IN (SELECT id FROM dwarf.flow WHERE status = 'cancelled')
   AND task = 'Woke'}), '0', 'the cancelled sleeper never woke');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
