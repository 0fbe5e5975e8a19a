# Copyright: dwarf project.
#
# 126_missing_worker_slot.pl: a database that got only one of its two
# workers, because max_worker_processes was used up.  The flows the missing
# worker owns (flow id modulo dwarf.workers) wait; the server log says which
# worker of which database cannot start and which setting to raise; the
# launcher keeps trying, and once a slot frees up (another database with
# dwarf is dropped) the worker starts and every flow completes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $NFLOWS = 40;

my $t0 = time;

# Five background worker slots: the logical replication launcher, dwarf's
# launcher, the two workers of "hog", and one for "short".  No runners and
# no parallel workers take slots.
my $node = new_node(
	'missing_worker_slot',
	'max_worker_processes' => 5,
	'max_parallel_workers' => 0,
	'dwarf.long_step'      => 0);

$node->safe_psql('postgres', 'CREATE DATABASE hog');
create_graph($node, 'hog');
wait_for_workers($node, 'both workers of "hog" run', count => 2, db => 'hog');

my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE DATABASE short');
create_graph($node, 'short');
wait_for_workers($node, 'one worker of "short" runs', count => 1, db => 'short');

my $missing;
ok( eval {
		$node->wait_for_log(
			qr/WARNING:  dwarf: worker \d of database "short" cannot start: no background worker slot is free/,
			$log_offset);
		1;
	},
	'the log says a worker of "short" cannot start');
my $log = slurp_file($node->logfile, $log_offset);
($missing) = $log =~ /worker (\d) of database "short" cannot start/;
$missing //= -1;
like($log, qr/HINT:  Raise max_worker_processes \(now 5\)/,
	'... and says which setting to raise');
is( $node->safe_psql('short',
		"SELECT count(*) FROM dwarf.worker_stats() WHERE worker = $missing"),
	'0', "worker $missing of \"short\" does not run");

# The flows of both owners: those of the running worker complete, those of
# the missing one wait for it.
my $owner = "((id & ((1::bigint << 48) - 1)) % 2)";
$node->safe_psql('short',
	"SELECT count(dwarf.create('g', jsonb_build_object('n', i))) FROM generate_series(1, $NFLOWS) i");
my $waiting = $node->safe_psql('short', "SELECT count(*) FROM dwarf.flow WHERE $owner = $missing");
ok($waiting > 0 && $waiting < $NFLOWS + 1, "flows of both workers: $waiting of the missing worker");
ok( $node->poll_query_until('short',
		"SELECT count(*) = 0 FROM dwarf.flow WHERE $owner <> $missing AND status = 'running'"),
	'the flows of the running worker complete');
is( $node->safe_psql('short',
		"SELECT count(*) FROM dwarf.flow WHERE $owner = $missing AND status = 'running'"),
	$waiting, 'the flows of the missing worker wait for it');

# Free two slots: drop the other database.
$log_offset = -s $node->logfile;
my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE hog');
is($rc, 0, 'the other database is dropped, which frees its slots') or diag $err;

wait_for_workers($node, 'both workers of "short" run', count => 2, db => 'short');
ok( eval {
		$node->wait_for_log(
			qr/LOG:  dwarf: worker $missing of database "short" is starting, after waiting \d+ s for a free slot/,
			$log_offset);
		1;
	},
	'the log says the missing worker is starting at last');
wait_flows_closed($node, 'short', 'every flow of "short" closed');
check_flows_exactly_once($node, 'short', when => 'once the missing worker started');
check_new_flow($node, 'short', 'a new flow runs');
check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
