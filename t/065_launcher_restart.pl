# Copyright: dwarf project.
#
# 065_launcher_restart.pl: the launcher ends (pg_terminate_backend) while its
# workers run a load.  The postmaster starts a new launcher, which stops the
# old workers and waits until they are gone before it starts new ones, so no
# flow ever has two workers: every flow completes and every task ran exactly
# once.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $NFLOWS = 1000;

my $t0   = time;
# One step per transaction, so that the load outlasts the launcher's restart.
my $node = new_node('launcher_restart', 'dwarf.batch_size' => 1);
create_graph($node, 'postgres');
wait_for_workers($node, 'two dwarf workers run');
check_warm_up_flow($node, 'postgres');

my $old_workers = $node->safe_psql('postgres',
	"SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE backend_type = 'dwarf worker'");

$node->safe_psql('postgres',
	"SELECT count(dwarf.create('g', jsonb_build_object('n', i)))
	   FROM generate_series(1, $NFLOWS) i");
is($node->safe_psql('postgres',
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'dwarf launcher'"),
	't', 'the launcher was told to end while the flows ran');

# The postmaster restarts the launcher after bgw_restart_time (5 s).
ok($node->poll_query_until('postgres', qq{
SELECT count(*) = 2 AND string_agg(pid::text, ',' ORDER BY pid) <> '$old_workers'
  FROM pg_stat_activity WHERE backend_type = 'dwarf worker'}),
	'a new launcher started new workers in place of the old ones');
note('flows still running when the new workers took over: '
	  . $node->safe_psql('postgres', "SELECT count(*) FROM dwarf.flow WHERE status = 'running'"));

wait_flows_closed($node, 'postgres', 'every flow closed after the launcher restart');
check_flows_exactly_once($node, 'postgres', when => 'after the launcher restart');
check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
