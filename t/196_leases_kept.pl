# Copyright: dwarf project.
#
# 196_leases_kept.pl: a lease is kept until it runs out or its flow really
# closes.  After a worker restart with many flows to load, a flow whose
# external step is leased waits its turn to be loaded for longer than the
# sweep's patience (10 sweeps, a second apart).  Its offer and lease must
# stay, and the outside worker's dwarf.complete go through (it was refused
# as "cancelled or closed", which was false).  A cancelled flow still has
# its offer withdrawn.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

# Flows 1..600 of the busy ones take 50 ms a step, the others none.
my $nbusy = 2400;
my $node = new_node('leases_kept', 'dwarf.workers' => 1, 'dwarf.batch_size' => 4,
	'dwarf.min_retry_delay' => 0);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
-- Nap: its flow goes on 20 s later; Work: 50 ms for the first 600 flows
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep('20 s');
	RETURN '{"napped": true}';
END $$;
CREATE FUNCTION app.work(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF (s->>'i')::int <= 600 THEN PERFORM pg_sleep(0.05); END IF;
	RETURN '{"worked": true}';
END $$;
SELECT dwarf.define('busy', '{"tasks": {"Nap": "app.nap", "Work": "app.work"},
  "transitions": [{"chain": ["Nap", "Work", "END"]}]}');
SELECT dwarf.define('ext', '{"tasks": {"X": {"external": "q", "lease": "10 min"}},
  "transitions": [{"from": "X", "to": "END"}]}');
});
wait_for_workers($node, 'the worker runs', count => 1);

# Many flows that nap, then work; then flow T (a higher id), whose step is
# leased.
$node->safe_psql('postgres',
	"SELECT dwarf.create('busy', jsonb_build_object('i', g)) FROM generate_series(1, $nbusy) g");
ok($node->poll_query_until('postgres',
		q{SELECT count(*) FROM dwarf.step WHERE task = 'Nap'}, $nbusy),
	'every busy flow napped (they wake 20 s after their nap)');
my $t = $node->safe_psql('postgres', q{SELECT dwarf.create('ext')});
my $lease = $node->safe_psql('postgres', q{SELECT lease FROM dwarf.claim('q', 1, NULL, '60 s')});
like($lease, qr/^\d+$/, "T's step is leased");

# Once they work, the worker restarts.  The new one loads its flows by id,
# a chunk of 1000, a second one while fewer than 1000 steps are ready, and
# then dwarf.batch_size flows for each batch it runs: T comes after 400
# steps of 50 ms, some 20 s (20 sweeps) later.
ok($node->poll_query_until('postgres',
		q{SELECT count(*) > 0 FROM dwarf.step WHERE task = 'Work'}),
	'the busy flows work');
my $old = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'});
$node->safe_psql('postgres', "SELECT pg_terminate_backend($old)");
my $restarted = time;
ok($node->poll_query_until('postgres', qq{SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'dwarf worker' AND pid <> $old}, '1'),
	'the worker is restarted');
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) FROM dwarf.flow WHERE status = 'running' AND id <> $t}, '0'),
	'every busy flow completes');
diag sprintf('the restarted worker completed the busy flows in %.1f s', time - $restarted);

is($node->safe_psql('postgres',
		qq{SELECT state FROM dwarf.external_steps('q') WHERE flow_id = $t}),
	'leased', "T's step is still offered, leased");
my ($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.complete($lease, '{"done": 1}')});
is($rc, 0, "the outside worker's complete goes through") or diag $err;
is($node->safe_psql('postgres', qq{SET statement_timeout = '60 s';
	SELECT status || ' ' || (state->>'done') FROM dwarf.await($t, '50 s')}),
	'completed 1', 'T completes with the answer');

# A flow cancelled while its worker does not hold it: its offer goes.
my $c = $node->safe_psql('postgres', q{SELECT dwarf.create('ext')});
my $lease_c = $node->safe_psql('postgres', q{SELECT lease FROM dwarf.claim('q', 1, NULL, '60 s')});
like($lease_c, qr/^\d+$/, "the second flow's step is leased");
$node->safe_psql('postgres', qq{SELECT dwarf.cancel($c, 'no longer needed')});
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) FROM dwarf.external_steps('q') WHERE flow_id = $c}, '0'),
	"a cancelled flow's offer is withdrawn");
($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.complete($lease_c, '{}')});
like($err, qr/cancelled/, "its lease's complete is refused: the flow was cancelled");

done_testing();
