# Copyright: dwarf project.
#
# 080_failover.pl: dwarf across a streaming-replication failover.
#
# Part 1, asynchronous failover under load.  A primary runs two databases:
# "postgres" with DwarfTest's graph "g" (ten tasks, each writing its row in
# public.done, whose primary key fails a second execution) and "side" with a
# sleeping graph "s" (Nap sleeps 5 s, then After) and a two-task graph "k";
# every task in "side" records dwarf.step_key() in public.marks (unique).
# A hot standby streams from it.  On the standby, before the failover: the
# functions that write flows refuse with 25006 "... cannot run on a standby
# server", the reading ones work, and no dwarf process runs.  Then, with
# hundreds of flows running and sleepers asleep, the standby is cut off
# from the primary (its walreceiver stopped), the primary goes on and hands
# out more flows (their ids and step keys never reach the standby), and is
# stopped with "pg_ctl stop -m immediate"; the standby is promoted.  On the
# promoted server: the workers start, every flow it has completes, each
# task's write and step row are there exactly once, no sleeper woke before
# its wake time, and no flow appeared that the old primary did not create.
# The standby is cut off (primary_conninfo emptied, reloaded) rather than
# paused with pg_wal_replay_pause(): WAL received while paused would still be
# replayed at promotion, so only a cut makes sure the last flows are lost.
#
# Part 2, ids across the promotion: the new primary's new flow ids and step
# keys differ from every id and step key the old primary handed out, those
# that were lost with it included.  (How ids are made is not assumed.)  And
# a step that ran on the old primary after the cut, and so again on the new
# one, got the same dwarf.step_key() both times.
#
# Part 3, synchronous failover: with the standby in synchronous_standby_names,
# every flow whose create the test saw committed exists after the immediate
# stop and promotion, completes, and no task ran twice.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $NLOAD    = 500;         # flows of "g" running when the standby is cut off
my $NSLEEP   = 20;          # flows of "s" asleep then
my $NKEYS    = 50;          # flows of "k" before the cut
my $NLOST_K  = 200;         # flows of "k" the old primary creates after the cut (lost)
my $NLOST_G  = 100;         # flows of "g" likewise
my $NNEW     = 300;         # flows of each of "k" and "g" created on the new primary
my $NAP      = '5 s';       # the sleepers' sleep
my $KNAP     = '1.5 s';     # the first k flows' sleep between K1 and K2

my $t0 = time;

# new_node initializes with wal_level = minimal: streaming needs replica.
my %streaming = (
	wal_level             => 'replica',
	max_wal_senders       => 10,
	max_replication_slots => 10,
	hot_standby           => 'on');

my $primary = new_node('primary', %streaming);

# ---------------------------------------------------------------- setup

create_graph($primary, 'postgres');
$primary->safe_psql('postgres', 'CREATE DATABASE side');
$primary->safe_psql('side', qq{
CREATE EXTENSION dwarf;
CREATE TABLE public.marks (flow_id bigint, task text, step_key text NOT NULL UNIQUE,
                           at timestamptz DEFAULT clock_timestamp(),
                           PRIMARY KEY (flow_id, task));
CREATE SCHEMA app;
CREATE FUNCTION app.mark(task text) RETURNS void LANGUAGE sql AS \$\$
	INSERT INTO public.marks (flow_id, task, step_key) VALUES (dwarf.flow_id(), task, dwarf.step_key())
\$\$;
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM dwarf.sleep('$NAP');
	PERFORM app.mark('Nap');
	RETURN '{"napped": true}';
END \$\$;
CREATE FUNCTION app.after(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM app.mark('After');
	RETURN '{"after": true}';
END \$\$;
CREATE FUNCTION app.k1(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	IF s ? 'nap' THEN
		PERFORM dwarf.sleep((s->>'nap')::interval);
	END IF;
	PERFORM app.mark('K1');
	RETURN '{"k1": true}';
END \$\$;
CREATE FUNCTION app.k2(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM app.mark('K2');
	RETURN '{"k2": true}';
END \$\$;
SELECT dwarf.define('s', '{"tasks": {"Nap": "app.nap", "After": "app.after"},
  "transitions": [{"from": "Nap", "to": "After"}]}');
SELECT dwarf.define('k', '{"tasks": {"K1": "app.k1", "K2": "app.k2"},
  "transitions": [{"from": "K1", "to": "K2"}]}');
});

wait_for_workers($primary, 'two dwarf workers run in postgres on the primary', db => 'postgres');
wait_for_workers($primary, 'two dwarf workers run in side on the primary',     db => 'side');
check_warm_up_flow($primary, 'postgres');
my $warm_id = $primary->safe_psql('postgres',
	"SELECT id FROM dwarf.flow WHERE input->>'src' = 'warmup'");
my $warm_step = $primary->safe_psql('postgres',
	"SELECT min(step_id) FROM dwarf.step WHERE flow_id = $warm_id");

# The standby: a base backup copies postgresql.conf, shared_preload_libraries
# included.
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

# ---------------------------------------------------------------- on the standby

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
is($standby->safe_psql('postgres', 'SHOW shared_preload_libraries'), 'dwarf',
	'the standby preloads dwarf too (from the copied postgresql.conf)');
is( $standby->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'dwarf%'"),
	'0', 'no dwarf launcher or worker runs on the standby');

# Reading works on the standby.
is( $standby->safe_psql('postgres',
		"SELECT count(*) || ' ' || count(*) FILTER (WHERE status = 'completed') FROM dwarf.history($warm_id)"),
	"$NTASKS $NTASKS", 'dwarf.history of a replayed flow works on the standby');
is( $standby->safe_psql('postgres',
		"SELECT string_agg(flow_id || ' ' || graph || ' ' || status, ',') FROM dwarf.list('g')"),
	"$warm_id g completed", 'dwarf.list works on the standby');
is( $standby->safe_psql('postgres',
		"SELECT status || ' ' || (state->>'count') FROM dwarf.snapshot($warm_id)"),
	"completed $NTASKS", 'dwarf.snapshot works on the standby');
is( $standby->safe_psql('postgres',
		"SET statement_timeout = '30 s'; SELECT status FROM dwarf.await($warm_id, '1 s')"),
	'completed', 'dwarf.await of a closed flow works on the standby');

# Writing is refused, by dwarf itself, with read_only_sql_transaction.
my %writes = (
	'dwarf.create'   => q{SELECT dwarf.create('g', '{"n": 1}')},
	'dwarf.run'      => q{SELECT * FROM dwarf.run('g', '{"n": 1}', timeout => '1 s')},
	'dwarf.define'   => q{SELECT dwarf.define('g2', '{"tasks": {"a1": "app.a1"}, "transitions": [{"from": "a1", "to": "END"}]}')},
	'dwarf.cancel'   => "SELECT dwarf.cancel($warm_id)",
	'dwarf.resume'   => "SELECT dwarf.resume($warm_id)",
	'dwarf.delete'   => "SELECT dwarf.delete($warm_id)",
	'dwarf.continue' => "SELECT dwarf.continue($warm_id)",
	'dwarf.fork'     => "SELECT dwarf.fork($warm_step)",
	'dwarf.purge'    => "SELECT dwarf.purge()");
foreach my $fn (sort keys %writes)
{
	my ($rc, $out, $err) = $standby->psql('postgres',
		"SET statement_timeout = '30 s';\n\\set VERBOSITY verbose\n$writes{$fn};");
	like($err, qr/ERROR:\s+25006: \Q$fn\E cannot run on a standby server/,
		"$fn on the standby fails with 25006 \"$fn cannot run on a standby server\"");
}

# ---------------------------------------------------------------- load

# The "g" load, and the standby replays part of it.
$primary->safe_psql('postgres', "
	SELECT count(dwarf.create('g', jsonb_build_object('n', i, 'src', 'load')))
	  FROM generate_series(1, $NLOAD) i");
ok( $standby->poll_query_until('postgres',
		"SELECT count(*) >= $NLOAD FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id
		  WHERE f.input->>'src' = 'load'"),
	'the standby has replayed some steps of the load');

# The sleepers and the first "k" flows; the standby sees the sleepers asleep
# (the cut follows at once, well within their $NAP).
my $sleepers_q = q{
	SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE g.name = 's' AND f.status = 'running'
	   AND EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id AND s.task = 'Nap')
	   AND NOT EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id AND s.task = 'After')};
$primary->safe_psql('side', "
	BEGIN;
	SELECT count(dwarf.create('s', jsonb_build_object('n', i))) FROM generate_series(1, $NSLEEP) i;
	SELECT count(dwarf.create('k', jsonb_build_object('n', i, 'nap', '$KNAP'))) FROM generate_series(1, $NKEYS) i;
	COMMIT;");
ok($standby->poll_query_until('side', $sleepers_q, $NSLEEP),
	"the standby has replayed the $NSLEEP sleepers going to sleep");
ok( $standby->poll_query_until('side',
		"SELECT count(DISTINCT flow_id) FROM dwarf.step WHERE task = 'K1'", $NKEYS),
	"the standby has replayed the K1 steps of the $NKEYS k flows");

# Cut the standby off: from now on the old primary's WAL never reaches it.
$standby->append_conf('postgresql.conf', "primary_conninfo = ''");
$standby->reload;
ok($standby->poll_query_until('postgres', 'SELECT count(*) FROM pg_stat_wal_receiver', '0'),
	'the standby no longer receives WAL');
ok($primary->poll_query_until('postgres', 'SELECT count(*) FROM pg_stat_replication', '0'),
	'the primary no longer sends WAL');

my ($sb_running, $sb_started) = split / /, $standby->safe_psql('postgres', q{
	SELECT count(*) || ' ' || count(*) FILTER (WHERE EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id))
	  FROM dwarf.flow f WHERE f.status = 'running'});
note "on the standby at the cut: $sb_running flows of g running, $sb_started of them started";
cmp_ok($sb_started, '>', 0, 'the standby has flows that were in the middle of running');

# The old primary goes on: flows the standby never hears of.
my @lost_k = split /\n/, $primary->safe_psql('side',
	"SELECT dwarf.create('k', jsonb_build_object('n', i, 'lost', true)) FROM generate_series(1, $NLOST_K) i");
my @lost_g = split /\n/, $primary->safe_psql('postgres',
	"SELECT dwarf.create('g', jsonb_build_object('n', i, 'src', 'lost')) FROM generate_series(1, $NLOST_G) i");
is(scalar @lost_k + scalar @lost_g, $NLOST_K + $NLOST_G,
	"the old primary created $NLOST_K k and $NLOST_G g flows after the cut");
ok( $primary->poll_query_until('side',
		"SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		  WHERE g.name = 'k' AND f.status = 'running'", '0'),
	'the old primary ran them, and the K2 steps of the first k flows (their step keys are handed out)');

# Everything the old primary handed out, as far as it can tell us.
my %old_ids_g = map { $_ => 1 } split /\n/, $primary->safe_psql('postgres', 'SELECT id FROM dwarf.flow');
my %old_ids_k = map { $_ => 1 } split /\n/, $primary->safe_psql('side', 'SELECT id FROM dwarf.flow');
my %old_keys  = map { $_ => 1 } split /\n/, $primary->safe_psql('side', 'SELECT step_key FROM public.marks');
my %old_key_of = map { my ($f, $t, $k) = split /\|/; ("$f|$t" => $k) } split /\n/,
  $primary->safe_psql('side', 'SELECT flow_id, task, step_key FROM public.marks');
my $old_max_g = $primary->safe_psql('postgres', 'SELECT max(id) FROM dwarf.flow');
my $old_max_k = $primary->safe_psql('side',     'SELECT max(id) FROM dwarf.flow');
note sprintf('old primary: %d flows in postgres (max id %s), %d in side (max id %s), %d step keys',
	scalar keys %old_ids_g, $old_max_g, scalar keys %old_ids_k, $old_max_k, scalar keys %old_keys);

is( $standby->safe_psql('side',
		'SELECT count(*) FROM dwarf.flow WHERE id IN (' . join(',', @lost_k) . ')')
	  . ' ' . $standby->safe_psql('postgres',
		'SELECT count(*) FROM dwarf.flow WHERE id IN (' . join(',', @lost_g) . ')'),
	'0 0', 'none of the flows created after the cut reached the standby');

my %marks_at_cut = map { $_ => 1 } split /\n/,
  $standby->safe_psql('side', "SELECT flow_id || '|' || task FROM public.marks");

$primary->stop('immediate');

# ---------------------------------------------------------------- failover

is( $standby->safe_psql('side', $sleepers_q), $NSLEEP,
	'the standby still has every sleeper asleep');
$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT pg_is_in_recovery()', 'f'),
	'the standby is promoted');

wait_for_workers($standby, 'two dwarf workers run in postgres after the promotion', db => 'postgres');
wait_for_workers($standby, 'two dwarf workers run in side after the promotion',     db => 'side');

wait_flows_closed($standby, 'postgres', 'every g flow on the new primary closes');
wait_flows_closed($standby, 'side', 'every sleeping and k flow on the new primary closes');

# No flow appeared that the old primary did not create.
my @here_g = split /\n/, $standby->safe_psql('postgres', 'SELECT id FROM dwarf.flow');
my @here_k = split /\n/, $standby->safe_psql('side',     'SELECT id FROM dwarf.flow');
is(scalar(grep { !$old_ids_g{$_} } @here_g), 0, 'every g flow on the new primary was created by the old one');
is(scalar(grep { !$old_ids_k{$_} } @here_k), 0, 'every side flow on the new primary was created by the old one');
note sprintf('the new primary has %d of the old primary\'s %d g flows and %d of its %d side flows',
	scalar @here_g, scalar keys %old_ids_g, scalar @here_k, scalar keys %old_ids_k);

check_flows_exactly_once($standby, 'postgres', when => 'after the failover');

# side: exactly once, from the marks and the step log.
sub check_side
{
	my ($node, $when) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $total = $node->safe_psql('side', 'SELECT count(*) FROM dwarf.flow');
	is( $node->safe_psql('side',
			"SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
			   FROM (SELECT status, count(*) n FROM dwarf.flow GROUP BY status) s"),
		"completed=$total", "all $total side flows completed $when");
	is( $node->safe_psql('side',
			"SELECT count(*) FROM dwarf.step WHERE status <> 'completed' OR error IS NOT NULL"),
		'0', "no side step failed (no duplicate mark from a re-run task) $when")
	  or diag $node->safe_psql('side',
		"SELECT flow_id, task, status, error->>'message' FROM dwarf.step
		  WHERE status <> 'completed' OR error IS NOT NULL LIMIT 10");
	is( $node->safe_psql('side',
			"SELECT count(*) FROM (SELECT flow_id, task FROM dwarf.step
			                        GROUP BY 1, 2 HAVING count(*) <> 1) x"),
		'0', "one step row per (flow, task) $when");
	is( $node->safe_psql('side',
			"SELECT count(*) FROM dwarf.step s FULL JOIN public.marks m
			     ON m.flow_id = s.flow_id AND m.task = s.task
			  WHERE s.flow_id IS NULL OR m.flow_id IS NULL"),
		'0', "every side step has its mark and every mark its step $when");
	is( $node->safe_psql('side', q{
			SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
			 WHERE f.state IS DISTINCT FROM f.input || CASE g.name
			         WHEN 's' THEN '{"napped": true, "after": true}'::jsonb
			         ELSE '{"k1": true, "k2": true}'::jsonb END}),
		'0', "every side flow's final state is right $when");
	is( $node->safe_psql('side', q{
			SELECT count(*) FROM public.marks m
			 WHERE m.step_key NOT LIKE m.flow_id || '-%-' || m.task}),
		'0', "every step key names its flow and task $when");
}
check_side($standby, 'after the failover');

# A step that ran on the old primary and again on the new one (its first
# run lost with the old primary's WAL) got the same step key both times.
my %new_key_of = map { my ($f, $t, $k) = split /\|/; ("$f|$t" => $k) } split /\n/,
  $standby->safe_psql('side', 'SELECT flow_id, task, step_key FROM public.marks');
my %here_k = map { $_ => 1 } @here_k;
my @surviving = grep { $here_k{ (split /\|/)[0] } } keys %old_key_of;
my @changed = grep { ($new_key_of{$_} // '') ne $old_key_of{$_} } @surviving;
note scalar(grep { !$marks_at_cut{$_} } @surviving)
  . ' steps the old primary ran after the cut ran again on the new primary';
is(scalar @changed, 0,
	'every step of a surviving flow that the old primary ran has the same step key on the new primary')
  or diag join("\n", map { "$_: old $old_key_of{$_}, new " . ($new_key_of{$_} // 'none') } @changed[0 .. ($#changed < 9 ? $#changed : 9)]);

# The sleepers completed, none before its wake time (step timestamps).
is( $standby->safe_psql('side', qq{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
		       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Nap') a,
		       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'After') b
		 WHERE g.name = 's' AND f.status = 'completed' AND b.started_at >= a.finished_at + '$NAP'}),
	$NSLEEP, 'every sleeper completed on the new primary, none before its wake time')
  or diag $standby->safe_psql('side', q{
	SELECT f.id, a.finished_at, b.started_at FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Nap') a,
	       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'After') b WHERE g.name = 's'});
cmp_ok( $standby->safe_psql('side', q{
		SELECT count(*) FROM public.marks m JOIN dwarf.flow f ON f.id = m.flow_id
		  JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE g.name = 's' AND m.task = 'After'
		   AND m.at > (SELECT min(backend_start) FROM pg_stat_activity WHERE backend_type = 'dwarf worker')}),
	'>', 0, 'some sleepers woke on the new primary (they slept across the failover)');

# ---------------------------------------------------------------- ids after the promotion

my @new_k = split /\n/, $standby->safe_psql('side',
	"SELECT dwarf.create('k', jsonb_build_object('n', i, 'new', true)) FROM generate_series(1, $NNEW) i");
my @new_g = split /\n/, $standby->safe_psql('postgres',
	"SELECT dwarf.create('g', jsonb_build_object('n', i, 'src', 'new')) FROM generate_series(1, $NNEW) i");
is(scalar @new_k + scalar @new_g, 2 * $NNEW, "the new primary created $NNEW k and $NNEW g flows");
wait_flows_closed($standby, 'postgres', 'the new g flows close');
wait_flows_closed($standby, 'side', 'the new k flows close');

my %new_keys = map { $_ => 1 } split /\n/, $standby->safe_psql('side',
	'SELECT m.step_key FROM public.marks m WHERE m.flow_id IN (' . join(',', @new_k) . ')');
is(scalar keys %new_keys, 2 * $NNEW, 'the new k flows recorded their step keys');

my @dup_g    = grep { $old_ids_g{$_} } @new_g;
my @dup_k    = grep { $old_ids_k{$_} } @new_k;
my @dup_keys = grep { $old_keys{$_} } keys %new_keys;
is(scalar @dup_g, 0, 'no new g flow id was handed out by the old primary (lost flows included)')
  or diag "repeated: @dup_g[0 .. ($#dup_g < 9 ? $#dup_g : 9)]";
is(scalar @dup_k, 0, 'no new k flow id was handed out by the old primary (lost flows included)')
  or diag "repeated: @dup_k[0 .. ($#dup_k < 9 ? $#dup_k : 9)]";
is(scalar @dup_keys, 0, 'no new step key was handed out by the old primary (lost flows included)')
  or diag "repeated: @dup_keys[0 .. ($#dup_keys < 9 ? $#dup_keys : 9)]";
# How it is done today: bits 40 to 47 hold the timeline less one, so the
# old primary (timeline 1) gave small ids and the promoted one (timeline 2)
# gives them with 1 there.
is(scalar(grep { $_ >= 2**32 } keys %old_ids_g), 0, 'the old primary, never promoted, gave ids below 2^32');
is(scalar(grep { (($_ >> 40) & 255) != 1 } @new_g, @new_k), 0,
	'the promoted primary gives ids with epoch 1 (timeline 2) in bits 40 to 47');

check_flows_exactly_once($standby, 'postgres', when => 'with the new flows');
check_side($standby, 'with the new flows');
check_new_flow($standby, 'postgres', 'dwarf.run works on the new primary');

check_no_crash($standby, 'no backend crashed on the promoted server');
check_no_crash($primary, 'no backend crashed on the old primary');

# ---------------------------------------------------------------- synchronous failover

my $sprimary = new_node('sync_primary', %streaming);
create_graph($sprimary, 'postgres');
wait_for_workers($sprimary, 'two dwarf workers run on the synchronous primary');
$sprimary->backup('base');
my $sstandby = PostgreSQL::Test::Cluster->new('sync_standby');
$sstandby->init_from_backup($sprimary, 'base', has_streaming => 1);
$sstandby->start;

# The walreceiver's application_name is the standby's cluster_name.
$sprimary->append_conf('postgresql.conf',
	"synchronous_standby_names = 'sync_standby'\nsynchronous_commit = on");
$sprimary->reload;
ok( $sprimary->poll_query_until('postgres',
		"SELECT sync_state FROM pg_stat_replication WHERE application_name = 'sync_standby'", 'sync'),
	'the standby is synchronous');

# Creates, each batch committed (and so flushed on the standby) before the
# next; the immediate stop comes while they run.
my @seen;
foreach my $b (1 .. 8)
{
	push @seen, split /\n/, $sprimary->safe_psql('postgres', "
		SELECT dwarf.create('g', jsonb_build_object('n', i, 'src', 'sync'))
		  FROM generate_series(" . (40 * $b - 39) . ', ' . (40 * $b) . ') i');
}
my $srunning = $sprimary->safe_psql('postgres',
	"SELECT count(*) FROM dwarf.flow WHERE status = 'running'");
$sprimary->stop('immediate');
note scalar(@seen) . " flows seen committed, $srunning running at the stop";
cmp_ok($srunning, '>', 0, 'flows were running at the synchronous primary\'s stop');

$sstandby->promote;
ok($sstandby->poll_query_until('postgres', 'SELECT pg_is_in_recovery()', 'f'),
	'the synchronous standby is promoted');
wait_for_workers($sstandby, 'two dwarf workers run on the promoted synchronous standby');
is( $sstandby->safe_psql('postgres',
		'SELECT count(*) FROM dwarf.flow WHERE id IN (' . join(',', @seen) . ')'),
	scalar @seen, 'every flow whose create was seen committed is on the promoted standby');
wait_flows_closed($sstandby, 'postgres', 'every flow closes after the synchronous failover');
check_flows_exactly_once($sstandby, 'postgres', when => 'after the synchronous failover');
check_no_crash($sstandby, 'no backend crashed on the promoted synchronous standby');
check_no_crash($sprimary, 'no backend crashed on the synchronous primary');

$sstandby->stop(Test::More->builder->is_passing ? 'fast' : 'immediate');
stop_node($standby, $t0);
done_testing();
