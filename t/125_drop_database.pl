# Copyright: dwarf project.
#
# 125_drop_database.pl: DROP DATABASE of a database whose dwarf workers run
# flows.  A plain DROP DATABASE succeeds (dwarf stops the database's workers,
# as dropdb does with autovacuum workers), and so does one WITH (FORCE); the
# launcher then sees the database gone and starts no worker for it again,
# where it used to start one every second, each failing with "database ...
# does not exist".  Another database's flows run on throughout.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $NFLOWS = 300;

my $t0   = time;
my $node = new_node('drop_database');
$node->safe_psql('postgres', 'CREATE DATABASE stays');
$node->safe_psql('postgres', 'CREATE DATABASE gone_plain');
$node->safe_psql('postgres', 'CREATE DATABASE gone_forced');
create_graph($node, $_) for qw(stays gone_plain gone_forced);
wait_for_workers($node, 'six dwarf workers run, two per database', count => 6);
check_warm_up_flow($node, $_) for qw(stays gone_plain gone_forced);

my %oid;
$oid{$_} = $node->safe_psql('postgres', "SELECT oid FROM pg_database WHERE datname = '$_'")
  for qw(gone_plain gone_forced);

# Load in every database, so that the workers are busy when the drops come.
$node->safe_psql($_,
	"SELECT count(dwarf.create('g', jsonb_build_object('n', i))) FROM generate_series(1, $NFLOWS) i")
  for qw(stays gone_plain gone_forced);

my $log_offset = -s $node->logfile;
my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE gone_plain');
is($rc, 0, 'a plain DROP DATABASE succeeds while its dwarf workers run flows')
  or diag $err;
($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE gone_forced WITH (FORCE)');
is($rc, 0, 'DROP DATABASE WITH (FORCE) succeeds') or diag $err;

for my $db (qw(gone_plain gone_forced))
{
	ok( eval { $node->wait_for_log(qr/database "$db" was dropped; its workers are not started again/,
				$log_offset); 1 },
		"the launcher says $db was dropped");
}

# Each failed start of a worker for a dropped database leaves this line.
my $fatal = qr/FATAL:  database ($oid{gone_plain}|$oid{gone_forced}) does not exist/;
sub count_fatal
{
	my $log = slurp_file($node->logfile, $log_offset);
	my $n   = () = $log =~ /$fatal/g;
	return $n;
}

# Stop one worker of "stays" and wait for the launcher to start its
# successor, which it does after its restart delay (a second): each round
# is a full restart cycle of the launcher, and the other database still
# runs meanwhile.
sub restart_round
{
	my ($round) = @_;
	my $old = $node->safe_psql('stays',
		"SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity
		  WHERE backend_type = 'dwarf worker' AND datname = 'stays'");
	$node->safe_psql('stays',
		"SELECT pg_terminate_backend(min(pid)) FROM pg_stat_activity
		  WHERE backend_type = 'dwarf worker' AND datname = 'stays'");
	return ok(
		$node->poll_query_until('stays', qq{
SELECT count(*) = 2 AND string_agg(pid::text, ',' ORDER BY pid) <> '$old'
  FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND datname = 'stays'}),
		"round $round: the launcher restarted a worker of the database that stays");
}

restart_round($_) for 1 .. 2;
my $fatal_before = count_fatal();
note "failed starts for the dropped databases before the launcher noticed: $fatal_before";
restart_round($_) for 3 .. 5;
is(count_fatal(), $fatal_before,
	'three launcher restart cycles later, no worker was started for a dropped database');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker'
		   AND datid IN ($oid{gone_plain}, $oid{gone_forced})"),
	'0', 'no dwarf worker runs for a dropped database');

wait_flows_closed($node, 'stays', 'every flow of the database that stays closed');
check_flows_exactly_once($node, 'stays', when => 'after the other databases were dropped');
check_new_flow($node, 'stays', 'a new flow runs in the database that stays');
check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
