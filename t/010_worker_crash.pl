# Copyright: dwarf project.
#
# 010_worker_crash.pl: kill -9 a dwarf worker while flows are running.
#
# The postmaster treats a background worker that dies by a signal as a crash:
# it terminates every backend, resets shared memory and restarts (with
# restart_after_crash = on).  dwarf's launcher then starts fresh workers that
# must rebuild every running flow from dwarf.flow and dwarf.step.  We check
# that every flow completes, that every task ran exactly once as far as the
# database can see (its SQL writes committed once, one completed step row per
# task), and that the final state is right.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $NFLOWS = 1000;    # flows created in one transaction
my $NRUNS  = 400;     # dwarf.run calls from a background session, at most

my $t0   = time;
my $node = new_node('worker_crash');    # dwarf preloaded, 2 workers, restart_after_crash

# ---------------------------------------------------------------- setup
#
# DwarfTest's graph "g" of $NTASKS tasks:
# a1 -> a2 -> a3 -> (b1 | b2 | b3) -> j (fan-in) -> c1 -> c2 -> c3.
# Every task records itself in public.done (primary key: a second execution
# of the same task of the same flow would fail the step) and returns a
# delta: one to add to "count", its name to append to "trail".
create_graph($node, 'postgres');

# The workers are up and the graph works before we load it.
wait_for_workers($node, 'two dwarf workers run');
check_warm_up_flow($node, 'postgres');

# ---------------------------------------------------------------- load

$node->safe_psql('postgres',
	"SELECT count(dwarf.create('g', jsonb_build_object('n', i, 'src', 'create')))
	   FROM generate_series(1, $NFLOWS) i");

# A client calling dwarf.run over and over, with a higher priority than the
# queued flows so that its flows run during the load.  It loses its
# connection in the crash; psql then exits.
my $script = '';
$script .= "SELECT 'run ' || status FROM dwarf.run('g', '{\"n\": $_, \"src\": \"run\"}', "
  . "timeout => '60 s', priority => -1);\n"
  for (1 .. $NRUNS);
my $tmp = PostgreSQL::Test::Utils::tempdir;
append_to_file("$tmp/run.sql", $script);
my $run_h = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-f', "$tmp/run.sql" ],
	'>', "$tmp/run.out", '2>', "$tmp/run.err",
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));

# Wait until the engine is well into the load (a tenth of its steps) and a
# few dwarf.run calls have come back (or half the load is done, if they are
# slow), then kill a worker in the middle of it.
my $steps_goal = int($NFLOWS * $NTASKS / 10);
my $steps_half = int($NFLOWS * $NTASKS / 2);
ok( $node->poll_query_until('postgres',
		"SELECT count(*) >= $steps_goal
		        AND ((SELECT count(*) FROM dwarf.flow
		               WHERE input->>'src' = 'run' AND status = 'completed') >= 3
		             OR count(*) >= $steps_half)
		   FROM dwarf.step"),
	"the load is under way (at least $steps_goal steps done)");

my $victim = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker' ORDER BY pid LIMIT 1");
my ($running_before, $completed_before, $steps_before) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE status = 'running'),
	        count(*) FILTER (WHERE status = 'completed'),
	        (SELECT count(*) FROM dwarf.step)
	   FROM dwarf.flow");
my $log_offset = -s $node->logfile;
ok($victim =~ /^\d+$/, "found a dwarf worker to kill (pid $victim)");
is(kill('KILL', $victim), 1, 'sent SIGKILL to the dwarf worker');
note "at the kill: $running_before running, $completed_before completed, $steps_before steps";
cmp_ok($running_before, '>', 0, 'flows were still running when the worker was killed');

# The postmaster notices and restarts everything.
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/\(PID $victim\) was terminated by signal 9/,
	'the server log shows the worker was killed by signal 9');

# The run client lost its connection; let it end.
eval { $run_h->finish; 1 } or $run_h->kill_kill;
my $run_out = slurp_file("$tmp/run.out");
my $run_err = slurp_file("$tmp/run.err");
my $runs_completed = () = $run_out =~ /^run completed$/mg;
my $runs_other = () = $run_out =~ /^run (?!completed$)/mg;
note "dwarf.run calls that returned completed before the crash: $runs_completed";
is($runs_other, 0, 'every dwarf.run that returned before the crash returned completed')
  or diag $run_out;
like($run_err, qr/server closed the connection|terminating connection|connection to server was lost/,
	'the dwarf.run client was disconnected by the crash');

# ---------------------------------------------------------------- recovery

wait_for_workers($node, 'two dwarf workers run again after the restart');
ok( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND pid = $victim") eq '0',
	'the killed worker is not among them');
is( $node->safe_psql('postgres',
		"SELECT count(*) >= $runs_completed FROM dwarf.flow WHERE input->>'src' = 'run'"),
	't', 'the flows of the dwarf.run calls that returned are in dwarf.flow');

wait_flows_closed($node, 'postgres', 'every flow has closed after the restart');

# Every flow completed, each task's write and step row are there exactly
# once, and every final state is {count: 10, trail: [a1..c3], n: input n}.
check_flows_exactly_once($node, 'postgres', when => 'after the worker crash');

# The engine still works after the crash.
check_new_flow($node, 'postgres', 'a new flow runs to completion after the restart');

# The only crash is the one we caused.
$log = slurp_file($node->logfile);
my $crashes = () = $log =~ /terminated by signal|terminated by exception/g;
is($crashes, 1, 'no backend crashed besides the worker we killed');
unlike($log, qr/PANIC|TRAP:/, 'no PANIC or assertion failure in the server log');

# A wedged worker may not answer SIGTERM: stop_node stops hard when something failed.
stop_node($node, $t0);
done_testing();
