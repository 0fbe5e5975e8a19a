# Copyright: dwarf project.
#
# 201_http_fair_share.pl: one role's HTTP calls cannot keep another's from
# starting (issue 44's HTTP item).  Two roles with USAGE on dwarf and
# EXECUTE on dwarf.http_call: mallory (hostile) and alice; two services of
# test/http_server.py: a shared host (A) and alice's own (B).  The attacks
# are sized small by the settings: 6 calls at once, 4 connections a host.
#
#  1. mallory's 40 calls hanging at A (timeout 5 min): she holds her share
#     of the calls at once (3 of 6) and of A's connections (2 of 4), and
#     the rest of her steps wait, offered; alice's call to B, then her call
#     to A, start and complete at once (the delays are printed; the bounds
#     asserted are generous).  Before, mallory's calls took every call at
#     once (first come, first served) and alice's waited out their 5 min.
#  2. A call that waits for a connection, behind its own role's calls at
#     its share of a host, keeps its lease (longer than its lease: 11 s)
#     and its timeout does not run: it is made once a connection is free.
#  3. dwarf.http_max_response_memory bounds the answers' memory up front:
#     at 3 MB with 1 MB answers, 3 calls at once, mallory alone holding
#     her share (1); alice's call still starts at once; the log says why
#     steps wait, naming the setting.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use HTTP::Tiny;
use JSON::PP;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $t0 = time;

my ($shared, $server_a) = start_http_server('shared');
my ($own,    $server_b) = start_http_server('own');
my $web = HTTP::Tiny->new(timeout => 30, proxy => undef, http_proxy => undef);

sub stats { return http_stats($_[0]) }

# Polls a server's stats until $cond->($stats) holds (up to $secs); the
# stats then, and the seconds it took.
sub wait_stats
{
	my ($base, $cond, $secs) = @_;
	my $start = time;
	my $s;
	while (1)
	{
		$s = stats($base);
		last if $cond->($s) || time - $start > $secs;
		select(undef, undef, undef, 0.02);
	}
	return ($s, time - $start);
}

my $node = new_node('http_fair',
	'dwarf.min_retry_delay'             => 0,
	'dwarf.http_max_in_flight'          => 6,
	'dwarf.http_max_host_connections'   => 4,
	'dwarf.http_allow'                  => "'$shared/, $own/'");
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT USAGE ON SCHEMA dwarf TO alice, mallory;
GRANT EXECUTE ON FUNCTION dwarf.http_call(text) TO alice, mallory;
});
wait_for_workers($node, 'two workers run');
ok($node->poll_query_until('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf http'", '1'),
	'the HTTP process runs');

# Runs SQL as a role; its output (an error is shown, and fails what follows).
sub as
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql, extra_params => [ '-U', $role ]);
	diag "$role: $err" if $rc != 0;
	return $out;
}

# Defines a one-call graph of a role's.
sub define_call
{
	my ($role, $graph, $method_url, $timeout) = @_;
	as($role, qq{SELECT dwarf.define('$graph', '{
		"tasks": {"call": {"http": "$method_url", "timeout": "$timeout"}},
		"transitions": [{"chain": ["call", "END"]}]}')});
}

# alice's call: creates a flow of $graph, and returns the seconds until
# the service at $base saw its request on $path, and the flow's outcome.
sub alice_call
{
	my ($graph, $base, $path) = @_;
	my $before = stats($base)->{by_path}{$path} // 0;
	my $start  = time;
	my $id     = as('alice', qq{SELECT dwarf.create('$graph', '{}')});
	my ($s, $took) = wait_stats($base, sub { ($_[0]{by_path}{$path} // 0) > $before }, 60);
	my $started = ($s->{by_path}{$path} // 0) > $before ? $took : undef;
	my $outcome = as('alice', qq{SET statement_timeout = '90 s';
		SELECT status FROM dwarf.await($id, '60 s')});
	note(sprintf('alice\'s call to %s: the service saw it %.3f s after dwarf.create, completed after %.3f s',
		$path, $took, time - $start));
	return ($started, $outcome);
}

# The HTTP steps offered now, by state, of every role: "leased|n ready|n".
sub offered
{
	return $node->safe_psql('postgres', q{
		SELECT string_agg(state || '|' || n, ' ' ORDER BY state)
		FROM (SELECT state, count(*) AS n FROM dwarf.external_steps('dwarf.http') GROUP BY state) s});
}

# ------------------------------------------------------------------ 1. mallory's backlog
define_call('mallory', 'hang', "POST $shared/hang/300000", '5 min');
define_call('alice', 'own', "POST $own/ok/own", '30 s');
define_call('alice', 'shared', "POST $shared/ok/shared", '30 s');
my $ids = as('mallory', q{SELECT string_agg(dwarf.create('hang', '{}')::text, ',') FROM generate_series(1, 40)});
my ($s) = wait_stats($shared, sub { ($_[0]{by_path}{'/hang/300000'} // 0) >= 2 }, 60);
ok($node->poll_query_until('postgres', q{
	SELECT count(*) FILTER (WHERE state = 'leased') = 3 AND count(*) FILTER (WHERE state = 'ready') = 37
	FROM dwarf.external_steps('dwarf.http')}), 'mallory holds her share of the calls at once (3 of 6); the rest of her steps wait, offered')
  or diag(offered());
sleep 1;
$s = stats($shared);
is($s->{in_flight}, 2, 'mallory\'s calls hold 2 of the shared host\'s 4 connections, her share');
is($s->{by_path}{'/hang/300000'}, 2, '... and made no more requests');

my ($started, $outcome) = alice_call('own', $own, '/ok/own');
ok(defined $started && $started < 10, 'alice\'s call to her own host starts at once');
is($outcome, 'completed', '... and completes');
($started, $outcome) = alice_call('shared', $shared, '/ok/shared');
ok(defined $started && $started < 10, 'alice\'s call to the shared host gets a connection at once');
is($outcome, 'completed', '... and completes');
is(stats($shared)->{by_path}{'/hang/300000'}, 2, 'mallory\'s calls still hold their 2 connections');

# ------------------------------------------------------------------ 2. a wait for a connection keeps the lease
# alice's call hangs at A: with mallory's, 2 roles hold A's connections,
# and alice's share is 1 (4 / (2 + 1)).  Her next call there waits for a
# connection, longer than its lease (timeout 1 s + 10 s).
define_call('alice', 'held', "POST $shared/hang/300000", '5 min');
define_call('alice', 'queued', "POST $shared/ok/queued", '1 s');
my $held = as('alice', q{SELECT dwarf.create('held', '{}')});
($s) = wait_stats($shared, sub { ($_[0]{by_path}{'/hang/300000'} // 0) >= 3 }, 60);
is($s->{by_path}{'/hang/300000'}, 3, 'alice\'s call holds a connection to the shared host beside mallory\'s 2');
my $queued = as('alice', q{SELECT dwarf.create('queued', '{}')});
ok($node->poll_query_until('postgres', qq{
	SELECT state FROM dwarf.external_steps('dwarf.http') WHERE flow_id = $queued}, 'leased'),
	'alice\'s next call there is claimed');
sleep 13;
is(as('alice', qq{SELECT status FROM dwarf.snapshot($queued)}), 'running',
	'waiting for a connection past its lease (11 s) and its timeout (1 s), it has not failed');
is(as('alice', qq{SELECT count(*) FROM dwarf.history($queued) WHERE status = 'failed'}), '0',
	'... no attempt of it failed');
is(stats($shared)->{by_path}{'/ok/queued'} // 0, 0, '... and it made no request yet');
as('alice', qq{SELECT dwarf.cancel($held, 'next')});
is(as('alice', qq{SET statement_timeout = '90 s'; SELECT status FROM dwarf.await($queued, '60 s')}),
	'completed', 'once alice\'s connection is free, the call is made and completes');
is(stats($shared)->{by_path}{'/ok/queued'}, 1, '... with one request');

# ------------------------------------------------------------------ 3. memory bound up front
as('mallory', qq{SELECT count(dwarf.cancel(id, 'next')) FROM unnest('{$ids}'::bigint[]) id});
ok($node->poll_query_until('postgres',
	"SELECT count(*) FROM dwarf.external_steps('dwarf.http')", '0'), 'the calls are gone');
$web->get("$shared/reset");
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET dwarf.http_max_response_memory = '3MB';
	ALTER SYSTEM SET dwarf.http_max_in_flight = 100;
	ALTER SYSTEM SET dwarf.http_max_host_connections = 100;
	SELECT pg_reload_conf()});
sleep 1;
my $log_at = -s $node->logfile;
$ids = as('mallory', q{SELECT string_agg(dwarf.create('hang', '{}')::text, ',') FROM generate_series(1, 20)});
wait_stats($shared, sub { ($_[0]{by_path}{'/hang/300000'} // 0) >= 1 }, 60);
sleep 2;
is(stats($shared)->{by_path}{'/hang/300000'}, 1,
	'3 MB of answers of 1 MB: mallory alone holds her share, 1 call')
  or diag(offered() . "\n" . encode_json(stats($shared)) . "\n" . $node->safe_psql('postgres', q{SELECT * FROM dwarf.external_steps('dwarf.http') WHERE state <> 'ready'}));
($started, $outcome) = alice_call('own', $own, '/ok/own');
ok(defined $started && $started < 10, 'alice\'s call starts at once');
is($outcome, 'completed', '... and completes');
ok($node->wait_for_log(qr/HTTP steps of role \d+ wait: it holds its share of 1 calls at once.*\n.*dwarf\.http_max_response_memory \(3072 kB\) has room for 3 answers of dwarf\.http_max_response \(1024 kB\)/, $log_at),
	'the log says why mallory\'s steps wait, naming the setting');
as('mallory', qq{SELECT count(dwarf.cancel(id, 'done')) FROM unnest('{$ids}'::bigint[]) id});

check_no_crash($node, 'no process crashed');
$server_a->kill_kill;
$server_b->kill_kill;
stop_node($node, $t0);
done_testing();
