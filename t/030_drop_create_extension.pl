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

my $NTASKS = 10;
my $t0     = time;
my $node   = PostgreSQL::Test::Cluster->new('drop_create');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'dwarf'
dwarf.workers = 2
max_worker_processes = 16
restart_after_crash = on
});
$node->start;
my $start_time = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

$node->safe_psql('postgres', 'CREATE DATABASE app');

# The task functions and the table they write live outside the extension,
# so they survive DROP EXTENSION.
$node->safe_psql('app', q{
CREATE TABLE public.done (flow_id bigint, task text, PRIMARY KEY (flow_id, task));
CREATE SCHEMA app;
CREATE FUNCTION app.work(s jsonb, task text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.pg_sleep(0.001);
	INSERT INTO public.done (flow_id, task) VALUES (dwarf.flow_id(), task);
	RETURN pg_catalog.jsonb_build_object('count', 1);
END $$;
DO $$
DECLARE t text;
BEGIN
	FOREACH t IN ARRAY ARRAY['a1','a2','a3','b1','b2','b3','j','c1','c2','c3'] LOOP
		EXECUTE format('CREATE FUNCTION app.%I(s jsonb) RETURNS jsonb LANGUAGE sql '
		               'AS $f$ SELECT app.work(s, %L) $f$', t, t);
	END LOOP;
END $$;
});

# The extension with its graph (a DROP EXTENSION takes the graph with it).
my $install = q{
CREATE EXTENSION dwarf;
SELECT dwarf.define('g', '{
  "tasks": {"a1": "app.a1", "a2": "app.a2", "a3": "app.a3",
            "b1": "app.b1", "b2": "app.b2", "b3": "app.b3", "j": "app.j",
            "c1": "app.c1", "c2": "app.c2", "c3": "app.c3"},
  "transitions": [
    {"chain": ["a1", "a2", "a3"]},
    {"from": "a3", "to": ["b1", "b2", "b3"]},
    {"from": "b1", "to": "j"}, {"from": "b2", "to": "j"}, {"from": "b3", "to": "j"},
    {"chain": ["j", "c1", "c2", "c3", "END"]}],
  "fan_in": ["j"],
  "reducers": {"count": "add"}}');
};

my $workers_in = sub {
	my ($db) = @_;
	return "SELECT count(*) FROM pg_stat_activity
	         WHERE backend_type = 'dwarf worker' AND datname = '$db'";
};

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
ok($node->poll_query_until('app', $workers_in->('app'), '2'),
	'CREATE EXTENSION starts two dwarf workers in its database');
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
ok($node->poll_query_until('app', $workers_in->('app'), '0'),
	'DROP EXTENSION (idle) stops the dwarf workers of the database');
# The flows went with the extension, and a new dwarf.flow_seq numbers flows
# from the start again: forget the old flows' writes.
$node->safe_psql('app', 'TRUNCATE public.done');
is($node->safe_psql('app', "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf launcher'"),
	'1', 'the launcher keeps running');

$node->safe_psql('app', $install);
ok($node->poll_query_until('app', $workers_in->('app'), '2'),
	'CREATE EXTENSION starts the workers again');
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
ok($node->poll_query_until('app', $workers_in->('app'), '0'),
	'DROP EXTENSION (busy) stops the dwarf workers of the database');
$node->safe_psql('app', 'TRUNCATE public.done');

$node->safe_psql('app', $install);
ok($node->poll_query_until('app', $workers_in->('app'), '2'),
	'CREATE EXTENSION starts the workers again after a busy drop');
flows_run('after busy drop and re-create', 100);

# ---------------------------------------------------------------- no crash

my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|terminated by exception|all server processes terminated|PANIC|TRAP:/,
	'no backend crashed during drop and re-create');
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $start_time,
	'the server was not restarted');

note sprintf('030_drop_create_extension took %.1f s', time - $t0);
$node->stop(Test::More->builder->is_passing ? 'fast' : 'immediate');
done_testing();
