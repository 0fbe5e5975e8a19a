# Copyright: dwarf project.
#
# 198_private_locks.pl: dwarf's own locks are out of every role's reach.
# dwarf.define serializes the versions of one owner's graph name, and
# dwarf.maintain runs one pass at a time, each under a lock.  They used
# advisory keys that any role can take with pg_advisory_lock (maintain:
# (1685551730, 1); define: (oid of dwarf.graph, hashtext(name))), so one
# idle session of a role without any privilege kept alice's define and the
# superuser's maintain waiting for as long as it liked.
#
#  1. mallory (LOGIN, nothing more) holds, in one idle session, every key
#     of the old locks and of the new ones' numbers, in pg_advisory_lock's
#     one-key (bigint) and two-key (int4, int4) forms: alice's define and
#     the superuser's maintain both finish;
#  2. the locks still do their work: while one transaction holds the pass
#     lock, a second maintain waits for it (and gives up at lock_timeout);
#     two defines of one name in parallel take two versions.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $start = time;
my $node = new_node('private_locks');

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app, dwarf TO alice;
CREATE FUNCTION app.echo(s jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT s';
});

# The keys of the locks, old and new, as pg_advisory_lock's two int4 keys.
my $graph_oid = $node->safe_psql('postgres',
	q{SELECT 'dwarf.graph'::regclass::oid::int4});
my $name_hash = $node->safe_psql('postgres', q{SELECT hashtext('g')});
my $alice_oid = $node->safe_psql('postgres', q{SELECT 'alice'::regrole::oid::int4});
my @pairs = ([ 1685551730, 1 ], [ 0, 0 ], [ $graph_oid, $name_hash ], [ $name_hash, $alice_oid ]);

# ---------------------------------------------------------------- 1. mallory's keys

my $mallory = $node->background_psql('postgres', extra_params => [ '-U', 'mallory' ]);
for my $p (@pairs)
{
	my ($k1, $k2) = @$p;
	$mallory->query_safe("SELECT pg_advisory_lock($k1, $k2)");
	# the same two keys as one bigint: the high and low 32 bits
	$mallory->query_safe(
		"SELECT pg_advisory_lock((${k1}::bigint << 32) | (${k2}::bigint & 4294967295))");
}
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.usename = 'mallory' AND l.locktype = 'advisory' AND l.granted}),
	2 * scalar(@pairs), "mallory's idle session holds every key in both forms");

my ($ret, $out, $err) = $node->psql('postgres',
	q{SET statement_timeout = '20 s';
	  SELECT dwarf.define('g', '{"tasks": {"A": "app.echo"}}')},
	extra_params => [ '-U', 'alice' ]);
is($ret, 0, "alice's define is not held up by mallory's keys") or diag($err);
is($out, '1', "alice's graph g is version 1");

($ret, $out, $err) = $node->psql('postgres',
	q{SET statement_timeout = '60 s';
	  SELECT dwarf.maintain() IS NOT NULL});
is($ret, 0, "the superuser's maintain is not held up by mallory's keys") or diag($err);
is($out, 't', 'the pass returns what it did');

$mallory->quit;

# ---------------------------------------------------------------- 2. the locks still work

my $holder = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN; SELECT dwarf_internal.lock_maintain()});
($ret, $out, $err) = $node->psql('postgres',
	q{SET lock_timeout = '300ms'; SELECT dwarf.maintain()});
isnt($ret, 0, 'a second pass waits for the one holding the pass lock');
like($err, qr/lock timeout/, 'and gives up at lock_timeout');
$holder->query_safe('COMMIT');
$holder->quit;

# dwarf_internal is not for PUBLIC: no role can take the pass lock either.
($ret, $out, $err) = $node->psql('postgres', q{SELECT dwarf_internal.lock_maintain()},
	extra_params => [ '-U', 'mallory' ]);
like($err, qr/permission denied/, 'mallory cannot call the lock function');

# Two defines of one name, in parallel, take two versions.
my @defs = map {
	my $h = $node->background_psql('postgres', extra_params => [ '-U', 'alice' ]);
	$h->query_safe('BEGIN');
	$h
} 1 .. 2;
$defs[0]->query_safe(q{SELECT dwarf.define('g', '{"tasks": {"A": "app.echo"}}')});
$defs[1]->query_until(qr/started/,
	qq{\\echo started\nSELECT dwarf.define('g', '{"tasks": {"A": "app.echo"}}');\n});
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.usename = 'alice' AND l.locktype = 'advisory' AND NOT l.granted}, '1'),
	"alice's second define waits for the first's commit");
$defs[0]->query_safe('COMMIT');
$defs[1]->query_safe('COMMIT');
$_->quit for @defs;
is( $node->safe_psql('postgres',
		q{SELECT string_agg(version::text, ',' ORDER BY version) FROM dwarf.graph WHERE name = 'g'}),
	'1,2,3', 'the parallel defines took versions 2 and 3');

check_no_crash($node, 'no crash');
stop_node($node, $start);
done_testing();
