# Copyright: dwarf project.
#
# 193_http_cancel_and_timeouts.pl: what an HTTP task's calls do when their
# flow is cancelled and when they time out, as the service sees it
# (test/http_server.py's /hang, which watches for its client closing the
# connection).
#
#  1. dwarf.cancel of a flow with three calls hanging (timeout 5 min): the
#     service sees the three connections closed promptly (the time is
#     printed; the bound asserted is generous), and the offers are gone;
#  2. a call that times out is retried with the same Idempotency-Key, and
#     the service sees each attempt's connection closed before the next
#     attempt's request: never two of one step's attempts open at once;
#  3. a call that waits for a connection (one connection per host, held
#     by another call) waits in the HTTP process, its timeout not running:
#     it has made no request and not failed past its timeout; the flow
#     holding the connection, once cancelled, closes it, and the waiting
#     call is made then (t/201 has a wait past the lease).
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

# The test's HTTP server, on 127.0.0.1 and a free port.
my ($base, $server) = start_http_server();
my ($port) = $base =~ /:(\d+)$/;
my $web  = HTTP::Tiny->new(timeout => 30, proxy => undef, http_proxy => undef);

# The HTTP server's counts (see test/http_server.py).
sub stats { return http_stats($base) }

# Polls the server's stats until $cond->($stats) holds (up to $secs); the
# stats then, and the seconds it took.
sub wait_stats
{
	my ($cond, $secs) = @_;
	my $start = time;
	my $s;
	while (1)
	{
		$s = stats();
		last if $cond->($s) || time - $start > $secs;
		select(undef, undef, undef, 0.02);
	}
	return ($s, time - $start);
}

my $node = new_node('http_cancel',
	'dwarf.min_retry_delay' => 0,
	'dwarf.http_allow'      => "'$base/'");
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION app.handle(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('handled', s->'onErr'->>'message') $$;
});
wait_for_workers($node, 'two workers run');
ok($node->poll_query_until('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf http'", '1'),
	'the HTTP process runs');

# The outcome of a flow once closed: "status|state".
sub outcome
{
	my ($id) = @_;
	return $node->safe_psql('postgres', qq{SET statement_timeout = '90 s';
		SELECT status || '|' || coalesce(state::text, '') FROM dwarf.await($id, '80 s')});
}

# ------------------------------------------------------------------ 1. cancel
$node->safe_psql('postgres', qq{SELECT dwarf.define('fan', '{
	"tasks": {"start": "app.noop", "call": {"http": "POST $base/hang/300000", "timeout": "5 min"}},
	"transitions": [{"from": "start", "to": "call", "for_each": "items", "as": "item"}]}')});
my $id = $node->safe_psql('postgres', q{SELECT dwarf.create('fan', '{"items": [1, 2, 3]}')});
my ($s) = wait_stats(sub { ($_[0]{by_path}{'/hang/300000'} // 0) == 3 }, 60);
is($s->{by_path}{'/hang/300000'}, 3, 'three calls hang at the service');
my $cancelled_at = time;
is($node->safe_psql('postgres', qq{SELECT dwarf.cancel($id, 'enough')}), 't', 'the flow is cancelled');
my $took;
($s, $took) = wait_stats(sub { $_[0]{closed} >= 3 }, 60);
my $last_close = (sort { $a <=> $b } @{ $s->{closed_at}{'/hang/300000'} // [] })[-1] // 0;
is($s->{closed}, 3, 'the service sees the three connections closed');
note(sprintf('the last connection closed %.3f s after dwarf.cancel returned (seen by polling in %.3f s)',
	$last_close - $cancelled_at, $took));
cmp_ok($took, '<', 5, 'promptly (seconds, not the calls\' 5-minute timeout)');
ok($node->poll_query_until('postgres',
	"SELECT count(*) FROM dwarf.external_steps('dwarf.http') WHERE flow_id = $id", '0'),
	'the cancelled flow has no HTTP step offered');
is($s->{answered}, 0, 'no call was answered');

# ------------------------------------------------------------------ 2. timeout, then retry
$web->get("$base/reset");
$node->safe_psql('postgres', qq{SELECT dwarf.define('slow', '{
	"tasks": {"call": {"http": "POST $base/hang/60000", "timeout": "1 s",
		"retry": {"attempts": 3, "initial": "10 ms"}}, "handle": "app.handle"},
	"transitions": [{"chain": ["call", "END"]},
		{"from": "call", "to": "handle", "on_error": true}, {"from": "handle", "to": "END"}]}')});
$id = $node->safe_psql('postgres', q{SELECT dwarf.create('slow', '{}')});
like(outcome($id), qr/"handled": "POST \Q$base\E\/hang\/60000 timed out after 1000 ms"/,
	'three timed-out attempts fail the step');
($s) = wait_stats(sub { $_[0]{closed} >= 3 }, 30);
is_deeply($s->{keys}{'/hang/60000'}, [ ("$id-0-0-call") x 3 ],
	'three requests, with the same Idempotency-Key');
is($s->{closed}, 3, 'the service saw each attempt\'s connection closed');
is($s->{overlaps}, 0, 'no attempt reached the service while an earlier one\'s connection was open');

# ------------------------------------------------------------------ 3. waiting for a connection
$web->get("$base/reset");
$node->safe_psql('postgres', q{ALTER SYSTEM SET dwarf.http_max_host_connections = 1; SELECT pg_reload_conf()});
$node->safe_psql('postgres', qq{SELECT dwarf.define('hold', '{
	"tasks": {"call": {"http": "POST $base/hang/120000", "timeout": "100 s"}},
	"transitions": [{"chain": ["call", "END"]}]}')});
$node->safe_psql('postgres', qq{SELECT dwarf.define('queued', '{
	"tasks": {"call": {"http": "POST $base/ok/queued", "timeout": "1 s"}, "handle": "app.handle"},
	"transitions": [{"chain": ["call", "END"]},
		{"from": "call", "to": "handle", "on_error": true}, {"from": "handle", "to": "END"}]}')});
sleep 1;	# the reload reaches the HTTP process
my $hold = $node->safe_psql('postgres', q{SELECT dwarf.create('hold', '{}')});
($s) = wait_stats(sub { ($_[0]{by_path}{'/hang/120000'} // 0) == 1 }, 60);
is($s->{by_path}{'/hang/120000'}, 1, 'one call holds the only connection to the service');
my $queued_at = time;
$id = $node->safe_psql('postgres', q{SELECT dwarf.create('queued', '{}')});
ok($node->poll_query_until('postgres',
	"SELECT state FROM dwarf.external_steps('dwarf.http') WHERE flow_id = $id", 'leased'),
	'the call that waits for the connection is claimed');
sleep 3;
is($node->safe_psql('postgres', qq{SELECT status FROM dwarf.snapshot($id)}), 'running',
	'3 s later, past its timeout (1 s), it waits on: its wait for a connection does not count');
is(stats()->{by_path}{'/ok/queued'}, undef, '... and it made no request');
$node->safe_psql('postgres', qq{SELECT dwarf.cancel($hold, 'done')});
($s, $took) = wait_stats(sub { $_[0]{closed} >= 1 }, 60);
is($s->{closed}, 1, 'the cancelled flow\'s connection is closed');
cmp_ok($took, '<', 5, '... promptly');
note(sprintf('closed %.3f s after the cancel (polled)', $took));
like(outcome($id), qr/^completed\|/, 'then the waiting call is made, and completes');
note(sprintf('it completed %.1f s after its flow was created', time - $queued_at));
is(stats()->{by_path}{'/ok/queued'}, 1, '... with one request');

$server->kill_kill;
stop_node($node, $t0);
done_testing();
