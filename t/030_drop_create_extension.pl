# Copyright: dwarf project.
#
# 030_drop_create_extension.pl: DROP EXTENSION stops the dwarf workers of
# that database, and CREATE EXTENSION starts them again, without a server
# restart; once re-created, the extension runs flows as before.  We drop it
# once while the workers are idle and once while they are busy with flows.
# The server must not crash or restart on the way, and databases without the
# extension must not keep dwarf workers.
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
my $node = new_node('drop_create');    # dwarf preloaded, 2 workers, restart_after_crash
my $start_time = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

$node->safe_psql('postgres', 'CREATE DATABASE app');

# The task functions of DwarfTest's graph "g" and the table they write
# (public.done) live outside the extension, so they survive DROP EXTENSION.
# Here the tasks return only {"count": 1} (no "trail").
create_tasks($node, 'app', trail => 0);

# The extension with graph "g" (a DROP EXTENSION takes the graph with it).
my $install = "CREATE EXTENSION dwarf;\n" . graph_sql(trail => 0);

# Runs a few flows to completion and checks them.
sub flows_run
{
	my ($label, $n) = @_;
	my $first = $node->safe_psql('app', 'SELECT coalesce(max(id), 0) FROM dwarf.flow');
	$node->safe_psql('app',
		"SELECT count(dwarf.create('g', jsonb_build_object('n', i))) FROM generate_series(1, $n) i");
	ok( $node->poll_query_until('app',
			"SELECT count(*) FROM dwarf.flow WHERE id > $first AND status = 'running'", '0'),
		"$label: $n new flows close");
	is( $node->safe_psql('app',
			"SELECT count(*) FILTER (WHERE status = 'completed' AND state->'count' = '10'::jsonb)
			        || ' ' || count(*)
			   FROM dwarf.flow WHERE id > $first"),
		"$n $n", "$label: the $n flows completed with count 10")
	  or diag $node->safe_psql('app',
		"SELECT id, status, error, state FROM dwarf.flow WHERE id > $first
		    AND (status <> 'completed' OR state->'count' IS DISTINCT FROM '10'::jsonb) LIMIT 5");
	is( $node->safe_psql('app',
			"SELECT count(*) FROM public.done d JOIN dwarf.flow f ON f.id = d.flow_id WHERE f.id > $first"),
		$NTASKS * $n, "$label: each of their tasks wrote its row once");
}

# ---------------------------------------------------------------- first install

$node->safe_psql('app', $install);
wait_for_workers($node, 'CREATE EXTENSION starts two dwarf workers in its database', db => 'app');
is( $node->safe_psql('app',
		"SET statement_timeout = '90 s';
		 SELECT status || ' ' || (state->>'count') FROM dwarf.run('g', '{}', timeout => '60 s')"),
	'completed 10', 'dwarf.run works');
flows_run('first install', 50);

# Databases without dwarf keep no workers (the launcher may probe them; the
# probe must exit).
ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM pg_stat_activity
		  WHERE backend_type = 'dwarf worker' AND datname IS DISTINCT FROM 'app'", '0'),
	'no dwarf worker stays in a database without the extension');

# ---------------------------------------------------------------- drop while idle

$node->safe_psql('app', 'DROP EXTENSION dwarf');
wait_for_workers($node, 'DROP EXTENSION (idle) stops the dwarf workers of the database',
	db => 'app', count => 0);
# The flows went with the extension, and a new dwarf.flow_seq numbers flows
# from the start again: forget the old flows' writes.
$node->safe_psql('app', 'TRUNCATE public.done');
is($node->safe_psql('app', "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf launcher'"),
	'1', 'the launcher keeps running');

$node->safe_psql('app', $install);
wait_for_workers($node, 'CREATE EXTENSION starts the workers again', db => 'app');
flows_run('after re-create', 50);

# ---------------------------------------------------------------- drop while busy

$node->safe_psql('app',
	"SELECT count(dwarf.create('g', jsonb_build_object('n', i))) FROM generate_series(1, 1000) i");
ok($node->poll_query_until('app', 'SELECT count(*) >= 1000 FROM dwarf.step'),
	'a load of 1000 flows is under way');
my $running = $node->safe_psql('app', "SELECT count(*) FROM dwarf.flow WHERE status = 'running'");
cmp_ok($running, '>', 0, "flows are running when the extension is dropped ($running)");

my ($rc, $out, $err) = $node->psql('app',
	"SET lock_timeout = '60 s'; DROP EXTENSION dwarf");
is($rc, 0, 'DROP EXTENSION succeeds while the workers are busy') or diag $err;
wait_for_workers($node, 'DROP EXTENSION (busy) stops the dwarf workers of the database',
	db => 'app', count => 0);
$node->safe_psql('app', 'TRUNCATE public.done');

$node->safe_psql('app', $install);
wait_for_workers($node, 'CREATE EXTENSION starts the workers again after a busy drop', db => 'app');
flows_run('after busy drop and re-create', 100);

# ---------------------------------------------------------------- no crash

check_no_crash($node, 'no backend crashed during drop and re-create');
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $start_time,
	'the server was not restarted');

stop_node($node, $t0);
done_testing();
