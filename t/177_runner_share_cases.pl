# Copyright: dwarf project.
#
# 177_runner_share_cases.pl: a role below its share of the runners gets one
# at once, however the role above it holds them.  mallory's slow steps
# (30 s each) hold every runner, and alice's 1 s slow flow must not wait for
# them, three times in a row in each case:
#
#  1. dwarf.max_runners = 2, mallory has nothing else waiting: alice's flow
#     completes in a second or two (one of mallory's runners is preempted);
#  2. the same, with a third step of mallory's waiting for a runner too;
#  3. default settings (dwarf.max_runners = -1: half of max_worker_processes,
#     4 of 8), where only 3 background worker slots are left for runners:
#     mallory's three steps hold every runner that can start, though fewer
#     than dwarf.max_runners.  Counting on the fourth, dwarf never preempted
#     one: alice's flow waited out mallory's steps.  Now a runner that cannot
#     be registered says how many can start, and that is what shares divide.
#
# alice's flow is made by dwarf.create in rounds 1 and 3 and waited for
# apart, by dwarf.run in round 2.  With dwarf.create, nothing but a runner's
# end woke the worker that had just lent alice's step (its loop looked for
# runners before the batch that lent it, and then slept without a timeout):
# alice waited out mallory's steps in case 1 every time, and in case 2
# whenever mallory's waiting step was not on the same worker (the issue
# measured 9 of 9, and 4 of 8).
#
# The bound, 10 s, is far above the 1-2 s alice's flow takes and far below
# mallory's 30 s steps.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $start = time;

# A node whose roles mallory and alice have a slow task each (known slow:
# their first steps ran past dwarf.long_step in a worker and ran again in a
# runner).  The task notes whose step runs in an advisory lock (mallory 1,
# alice 2), for pg_locks to show.
sub share_node
{
	my ($name, %conf) = @_;
	my $node = new_node($name, 'dwarf.long_step' => "'200ms'", %conf);
	$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app, dwarf TO alice, mallory;
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock_shared(CASE current_user WHEN 'mallory' THEN 1 ELSE 2 END,
										 (dwarf.flow_id() % 1000000)::int);
	PERFORM pg_sleep((s->>'sleep')::float8);
	RETURN '{"done": true}';
END $$;
CREATE FUNCTION app.alice_nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock_shared(2, (dwarf.flow_id() % 1000000)::int);
	PERFORM pg_sleep((s->>'sleep')::float8);
	RETURN '{"done": true}';
END $$;
});
	$node->safe_psql('postgres', q{SELECT dwarf.define('nap', '{"tasks": {"N": "app.nap"}}')},
		extra_params => [ '-U', 'mallory' ]);
	$node->safe_psql('postgres', q{SELECT dwarf.define('nap', '{"tasks": {"N": "app.alice_nap"}}')},
		extra_params => [ '-U', 'alice' ]);
	wait_for_workers($node, "$name: the workers run", count => $conf{'dwarf.workers'} // 2);
	for my $role ('mallory', 'alice')
	{
		is( $node->safe_psql('postgres',
				q{SET statement_timeout = '60 s';
				  SELECT status FROM dwarf.run('nap', '{"sleep": 0.4}', timeout => '50 s')},
				extra_params => [ '-U', $role ]),
			'completed', "$name: $role\'s warm-up flow completes");
	}
	return $node;
}

# Runners running steps, by role: "mallory:2", say.
my $held = q{SELECT coalesce(string_agg(r || ':' || n, ',' ORDER BY r), '') FROM
 (SELECT CASE l.classid WHEN 1 THEN 'mallory' ELSE 'alice' END AS r, count(*) AS n
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
   WHERE a.backend_type = 'dwarf runner' AND l.locktype = 'advisory' AND l.granted GROUP BY 1) s};

# mallory's $nflows flows of 30 s steps hold $nrunners runners; alice's 1 s
# slow flow, three times, must complete well before mallory's steps could
# end.  Then mallory's flows are cancelled.
sub alice_rounds
{
	my ($node, $case, $nflows, $nrunners) = @_;
	my @m = map {
		$node->safe_psql('postgres', qq{SELECT dwarf.create('nap', '{"sleep": 30, "i": $_}')},
			extra_params => [ '-U', 'mallory' ])
	} (1 .. $nflows);
	for my $round (1 .. 3)
	{
		ok($node->poll_query_until('postgres', $held, "mallory:$nrunners"),
			"$case, round $round: mallory's steps hold $nrunners runners");
		my $t0 = time;
		my $status;
		if ($round == 2)
		{
			# dwarf.run, whose answer the worker gives
			$status = $node->safe_psql('postgres',
				q{SET statement_timeout = '60 s';
				  SELECT status FROM dwarf.run('nap', '{"sleep": 1}', timeout => '40 s')},
				extra_params => [ '-U', 'alice' ]);
		}
		else
		{
			# dwarf.create, then waiting apart: nothing but the runners
			# wakes the worker that lent the step
			my $id = $node->safe_psql('postgres', q{SELECT dwarf.create('nap', '{"sleep": 1}')},
				extra_params => [ '-U', 'alice' ]);
			$status = 'running';
			while (time - $t0 < 40)
			{
				$status = $node->safe_psql('postgres', "SELECT status FROM dwarf.flow WHERE id = $id");
				last if $status ne 'running';
				usleep(100_000);
			}
		}
		my $took = time - $t0;
		ok($status eq 'completed' && $took < 10,
			sprintf("%s, round %d: alice's 1 s slow flow completes in %.2f s", $case, $round, $took))
		  or diag $node->safe_psql('postgres',
			"SELECT pid, state, backend_type, wait_event FROM pg_stat_activity WHERE backend_type LIKE 'dwarf%'");
	}
	$node->safe_psql('postgres', "SELECT dwarf.cancel($_, 'test over')") for @m;
	ok($node->poll_query_until('postgres', $held, ''), "$case: no runner runs a step any more");
}

# ---------------------------------------------------------------- 1. and 2.
my $node = share_node('runner_share_cases', max_worker_processes => 32,
	'dwarf.max_runners' => 2);
alice_rounds($node, 'mallory has nothing waiting', 2, 2);
alice_rounds($node, 'a step of mallory waits too', 3, 2);
my $preempted = () = slurp_file($node->logfile) =~ /is preempted: /g;
cmp_ok($preempted, '>=', 6, "the log says a runner was preempted for each of alice's flows ($preempted)");
check_no_crash($node, 'no process crashed');
stop_node($node, $start);

# ---------------------------------------------------------------- 3. default settings
# dwarf.max_runners = -1 counts on half of max_worker_processes (4 of 8),
# but the logical replication launcher, dwarf's launcher and its three
# workers leave 3 slots: mallory's steps hold every runner that can start.
$node = share_node('runner_share_defaults', max_worker_processes => 8, 'dwarf.workers' => 3);
alice_rounds($node, 'default settings, mallory has nothing waiting', 3, 3);
alice_rounds($node, 'default settings, a step of mallory waits too', 4, 3);
like(slurp_file($node->logfile), qr/is preempted: the role holds 3 of the 3 runners that can start \(dwarf.max_runners is 4\)/,
	'the log says mallory held every runner that can start, 3 of 4');
my $no_slot = () = slurp_file($node->logfile) =~ /a runner could not start: no background worker slot is free/g;
ok($no_slot >= 1 && $no_slot <= 2 * 3 * 4,
	"the log says a runner could not start, at most once a worker every 10 s ($no_slot lines)");
check_no_crash($node, 'no process crashed');
stop_node($node, $start);
done_testing();
