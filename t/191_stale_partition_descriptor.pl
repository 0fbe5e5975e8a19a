# Copyright: dwarf project.
#
# 191_stale_partition_descriptor.pl: a process whose partition descriptor
# of dwarf.step_log was built while a segment was attached still routes
# and reads steps by the segments as they are.
#
# PostgreSQL 15 builds a partitioned table's partition descriptor in two
# steps: the children from pg_inherits, then each child's bound from the
# catalog cache.  A cache miss in the second step that takes the
# transaction's first lock on pg_class reads the pending invalidations; if
# a segment was attached in between, its invalidation clears the entry in
# the middle of the build, and the build then stores the descriptor made
# from the old children, which nothing clears until the step log's
# partitions change again (src/partitions.c).  Too rare to meet on purpose
# (t/120 met it about once in a dozen runs), so gdb makes it happen: it
# stops the process where the children have just been read, another
# session attaches a segment and commits, and gdb has the process read
# the invalidations, as that first lock would, before it goes on.
#
#  1. A worker (dwarf.workers = 1) loading and running a flow whose id the
#     new segment covers: the flow's steps go to that segment, not to
#     dwarf.step_default (where they were written, silently, under the
#     live segment, before), and so do those of the next flow in it.
#  2. A session reading the step log: once the statement during which the
#     segment was attached is done, its next reads find the steps that a
#     flow wrote into the new segment meanwhile (dwarf.history and a read
#     of dwarf.step_log by flow id); before, they were pruned to
#     dwarf.step_default, and found nothing until the next change of the
#     step log's partitions.
#  3. The same session reading the archive while dwarf.maintain hands part
#     1's segment over to it: its next reads find that segment's steps
#     there (before, they found none, as its descriptor of the archive
#     lacked the segment).
#
# Every wait polls with a deadline; nothing is timed.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $node = new_node('stale_partdesc', 'dwarf.workers' => 1);
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.one(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"n": 1}'::jsonb $$;
SELECT dwarf.define('two', '{"tasks": {"A": "app.one", "B": "app.one"},
  "transitions": [{"chain": ["A", "B", "END"]}], "reducers": {"n": "add"}}');
});
wait_for_workers($node, 'the worker runs', count => 1);

my $steplog = $node->safe_psql('postgres', "SELECT 'dwarf.step_log'::regclass::oid");
my $tmp     = PostgreSQL::Test::Utils::tempdir;
my $connstr = $node->connstr('postgres');

# A flow before any segment: its steps go to dwarf.step_default; the
# worker's descriptor is built.
my $warm = $node->safe_psql('postgres', "SELECT flow_id FROM dwarf.run('two', '{}')");
is($node->safe_psql('postgres', "SELECT count(*) FROM dwarf.step_default WHERE flow_id = $warm"),
	'1', 'before any segment, a flow\'s steps are one row in dwarf.step_default');

# segment($lo, $hi): SQL that makes a live segment of the step log for flow
# ids [$lo, $hi).
sub segment
{
	my ($lo, $hi) = @_;
	return "SELECT dwarf_internal.make_step_segment($lo, $hi, true)";
}

# racing_build($pid, $sql, $trigger, $table): stops process $pid under gdb
# where its next build of the partition descriptor of the table whose oid
# is $table (default dwarf.step_log) has read the children, has another
# session run $sql meanwhile (it commits), then has the process read the
# invalidations and go on.  $trigger is run once gdb waits, to make the
# process build.  Returns what $trigger returned.
sub racing_build
{
	my ($pid, $sql, $trigger, $table) = @_;
	$table //= $steplog;
	my $sqlfile = "$tmp/attach.sql";
	my $cmdfile = "$tmp/gdb.cmd";
	open(my $f, '>', $sqlfile) or die $!;
	print $f "SET lock_timeout = '10 s';\n$sql;\nSELECT 'committed meanwhile';\n";
	close $f;
	open($f, '>', $cmdfile) or die $!;
	print $f <<"EOF";
set pagination off
break find_inheritance_children_extended if \$rdi == $table
continue
finish
shell psql -X -q -At -v ON_ERROR_STOP=1 -d '$connstr' -f $sqlfile
call (void) AcceptInvalidationMessages()
detach
quit
EOF
	close $f;
	my ($out, $err) = ('', '');
	my $timer = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);
	my $h = IPC::Run::start([ 'gdb', '-nx', '-batch', '-p', $pid, '-x', $cmdfile ],
		'<', \undef, '>', \$out, '2>', \$err, $timer);
	$h->pump until $out =~ /^Breakpoint 1 at/m || $timer->is_expired;
	my $result = $trigger->();
	$timer->start($PostgreSQL::Test::Utils::timeout_default);
	$h->pump while $h->pumpable && !$timer->is_expired;
	$h->finish;
	like($out, qr/^Breakpoint 1, .*find_inheritance_children_extended/m,
		'gdb stopped the process in the descriptor\'s build')
	  or diag "gdb's output:\n$out\n$err";
	like($out, qr/^committed meanwhile$/m, 'the other session committed while it was stopped')
	  or diag "gdb's output:\n$out\n$err";
	like($out, qr/Inferior 1 \(process $pid\) detached/, 'gdb let the process go')
	  or diag "gdb's output:\n$out\n$err";
	return $result;
}

# 1. The worker.  A segment made far ahead changes the step log's
# partitions: the worker builds its descriptor again at its next flow.  The
# segment attached meanwhile covers that flow and the next one; part 2's
# covers the two after.
my $next = $node->safe_psql('postgres', 'SELECT dwarf_internal.next_flow_id()');
$node->safe_psql('postgres', segment($next + 1000000, $next + 2000000));
my $worker = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'");
my ($lo, $hi) = ($next, $next + 2);
my $flow = racing_build($worker, segment($lo, $hi),
	sub { $node->safe_psql('postgres', "SELECT dwarf.create('two', '{}')") });
is($flow, $next, 'the flow has the id the new segment starts at');
ok($node->poll_query_until('postgres', "SELECT status FROM dwarf.flow WHERE id = $flow", 'completed'),
	'the flow completes');
my $seg = $node->safe_psql('postgres', "SELECT relation FROM dwarf.segment WHERE lo = $lo");
my $where = "SELECT (SELECT count(*) FROM dwarf.step_default WHERE flow_id = %d) || ' in the default, '
	|| (SELECT count(*) FROM dwarf.$seg WHERE flow_id = %d) || ' in the segment'";
is($node->safe_psql('postgres', sprintf($where, $flow, $flow)),
	'0 in the default, 1 in the segment',
	'the worker wrote the flow\'s steps into the segment attached while it built its descriptor');
my $later = $node->safe_psql('postgres', "SELECT flow_id FROM dwarf.run('two', '{}')");
is($node->safe_psql('postgres', sprintf($where, $later, $later)),
	'0 in the default, 1 in the segment', 'and the next flow\'s too');
is($node->safe_psql('postgres', "SELECT count(*) FROM dwarf.history($flow)"),
	'2', 'dwarf.history finds both steps of the flow');

# 2. A session reading the step log.
my ($in, $out, $err) = ('', '', '');
my $psql = IPC::Run::start([ 'psql', '-X', '-q', '-At', '-d', $connstr ],
	'<', \$in, '>', \$out, '2>', \$err,
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
# ask($sql): one result line of $sql in the reading session.
sub ask
{
	my ($sql) = @_;
	$out = '';
	$in .= "$sql;\nSELECT 'done';\n";
	$psql->pump until $out =~ /^done$/m;
	$out =~ s/\ndone\n$//;
	return $out;
}
my $reader = ask('SELECT pg_backend_pid()');
is(ask("SELECT count(*) FROM dwarf.history($flow)"), '2', 'the session reads a flow\'s history');
$node->safe_psql('postgres', segment($next + 2000000, $next + 3000000));
($lo, $hi) = ($hi, $hi + 2);
is($node->safe_psql('postgres', 'SELECT dwarf_internal.next_flow_id()'), $lo,
	'the next flow will be the first of the next segment');
my $during = racing_build($reader,
	segment($lo, $hi) . ";\nSELECT status FROM dwarf.run('two', '{}')",
	sub { ask("SELECT count(*) FROM dwarf.step_log WHERE flow_id = $lo") });
note "read while the segment was attached: $during";
is(ask("SELECT count(*) FROM dwarf.history($lo)"), '2',
	'the session\'s next dwarf.history finds the steps written into the new segment');
is(ask("SELECT count(*) FROM dwarf.step_log WHERE flow_id = $lo"), '1',
	'and a read of dwarf.step_log by flow id finds their row');

# 3. The same session reading the archive while a pass hands part 1's
# segment over to it (its flows closed, the ids past it): a segment made
# straight into the archive, far ahead, changes the archive's partitions
# first.
my $archive = $node->safe_psql('postgres', "SELECT 'dwarf.step_log_archive'::regclass::oid");
$node->safe_psql('postgres',
	"SELECT dwarf_internal.make_step_segment($next + 3000000, $next + 4000000, false)");
$during = racing_build($reader, 'SELECT dwarf.maintain()',
	sub { ask("SELECT count(*) FROM dwarf.step_log_archive WHERE flow_id = $flow") },
	$archive);
note "read while the segment was handed over: $during";
is($node->safe_psql('postgres', "SELECT live FROM dwarf.segment WHERE lo = $flow"),
	'f', 'the pass handed part 1\'s segment over to the archive');
is(ask("SELECT count(*) FROM dwarf.history($flow)"), '2',
	'the session\'s next dwarf.history finds the steps of a flow in the segment handed over');
is(ask("SELECT count(*) FROM dwarf.step_log_archive WHERE flow_id = $flow"), '1',
	'and a read of dwarf.step_log_archive by flow id finds their row');
$in .= "\\q\n";
$psql->finish;

check_no_crash($node);
$node->stop;
done_testing();
