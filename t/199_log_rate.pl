# Copyright: dwarf project.
#
# 199_log_rate.pl: the server log grows by a bounded number of lines while
# steps wait, however many wait.  Lines that could repeat once a step (or a
# batch) say it at most once every 10 s in a process, with a count.  Before,
# each waiting step said it every time it tried again: one role's steps
# wrote 2.4 million lines (609 MB) in 6 minutes.
#
#  1. about 100 external steps of alice's wait for room to be offered (their
#     6 kB states fill dwarf.external_memory's 64 kB after about ten), each
#     trying again every second: in 13 s
#     the log gains a handful of "wait for room to be offered" lines (at most two a
#     worker, one first and one with the count), not one a step a second;
#     the later line says how many times it stands for;
#  2. 100 steps of a task that meets a server error (disk_full) are put off
#     again and again: the "met a server error" and "rolled back" lines are
#     as few;
#  3. in all, the log gains a bounded number of lines.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $start = time;
my $node = new_node('log_rate', 'dwarf.external_memory' => "'64kB'");

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app, dwarf TO alice;
CREATE FUNCTION app.full(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'no space left (the test''s)' USING ERRCODE = 'disk_full';
END $$;
});
$node->safe_psql('postgres', q{
SELECT dwarf.define('ext', '{"tasks": {"E": {"external": "q"}}}');
SELECT dwarf.define('full', '{"tasks": {"F": "app.full"}}');
}, extra_params => [ '-U', 'alice' ]);
wait_for_workers($node, 'two workers run');

# Lines of the log from byte $from on that match $re.
sub lines_matching
{
	my ($from, $re) = @_;
	return scalar(grep { /$re/ } split /\n/, substr(slurp_file($node->logfile), $from));
}

my $from = -s $node->logfile;
my $t0   = time;
$node->safe_psql('postgres', q{
SELECT dwarf.create('ext', jsonb_build_object('pad', repeat('x', 6000))) FROM generate_series(1, 110);
SELECT dwarf.create('full', '{}') FROM generate_series(1, 100);
}, extra_params => [ '-U', 'alice' ]);
sleep(0.1) while time - $t0 < 13;
my $offered = $node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.external_steps('q')});
ok($offered > 0 && $offered < 20, "$offered external steps are offered, the others wait");

# ---------------------------------------------------------------- 1. no room to offer
my $no_room = lines_matching($from, qr/steps of external tasks wait for room to be offered/);
cmp_ok($no_room, '>=', 1, 'the log says external steps wait for room');
cmp_ok($no_room, '<=', 2 * 3, "and says it at most once a worker every 10 s ($no_room lines in 13 s)");
my @counts = substr(slurp_file($node->logfile), $from)
  =~ /(\d+) steps of external tasks wait for room to be offered \(in the last \d+ s\)/g;
my $count = $counts[-1];
ok(defined $count && $count > 100,
	'a later line counts the waits it stands for (' . ($count // 'none') . ')');

# ---------------------------------------------------------------- 2. server errors
my $deferred = lines_matching($from, qr/met a server error, running it again/);
cmp_ok($deferred, '>=', 1, 'the log says steps are put off for a server error');
cmp_ok($deferred, '<=', 2 * 3, "at most once a worker every 10 s ($deferred lines)");
my $rolled = lines_matching($from, qr/rolled back, running it step by step/);
cmp_ok($rolled, '<=', 2 * 3, "batches rolled back: at most once a worker every 10 s ($rolled lines)");
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE g.name = 'full' AND f.status = 'running'}),
	'100', 'the steps that met a server error are put off, not failed');

# ---------------------------------------------------------------- 3. the log in all
my $all = lines_matching($from, qr/^(?!.*statement: )/);
cmp_ok($all, '<', 100, "the log gained $all lines (besides the test's statements) in 13 s while 200 steps waited");

check_no_crash($node, 'no crash');
stop_node($node, $start);
done_testing();
