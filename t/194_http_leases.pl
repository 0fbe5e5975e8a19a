# Copyright: dwarf project.
#
# 194_http_leases.pl: the leases of HTTP tasks' calls belong to the HTTP
# process, and none outlives its flow.
#
#  1. dwarf.complete, dwarf.fail and dwarf.extend refuse the lease of an
#     HTTP call (queue dwarf.http), saying so; the call goes on and its own
#     answer completes the step;
#  2. a flow whose branches' HTTP calls are all answered, and which fails on
#     the first answer it records (a 404, no on_error edge), leaves no offer
#     behind: the others' answers were taken but not recorded, and their
#     offers stayed "answering", holding room of dwarf.max_external_steps.
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

# The HTTP server's counts (see test/http_server.py).
sub stats { return http_stats($base) }

my $node = new_node('http_leases',
	'dwarf.min_retry_delay' => 0,
	'dwarf.http_allow'      => "'$base/'");
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
});
wait_for_workers($node, 'two workers run');
ok($node->poll_query_until('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf http'", '1'),
	'the HTTP process runs');

sub outcome
{
	my ($id) = @_;
	return $node->safe_psql('postgres', qq{SET statement_timeout = '60 s';
		SELECT status || '|' || coalesce(state::text, '') FROM dwarf.await($id, '50 s')});
}

# ------------------------------------------------------------------ 1. not anyone's to answer
# Leases are drawn from one counter: the HTTP call's is the next after an
# external step's claimed just before it (or close after, if the HTTP
# process claimed meanwhile).
$node->safe_psql('postgres', q{SELECT dwarf.define('outside', '{"tasks": {"a": {"external": "q"}},
	"transitions": [{"chain": ["a", "END"]}]}')});
$node->safe_psql('postgres', qq{SELECT dwarf.define('call', '{"tasks": {"a": {"http": "POST $base/delay/4000", "timeout": "30 s"}},
	"transitions": [{"chain": ["a", "END"]}]}')});
my $outside = $node->safe_psql('postgres', q{SELECT dwarf.create('outside', '{}')});
my $lease = $node->safe_psql('postgres', q{SELECT lease FROM dwarf.claim('q', wait => '30 s')});
ok($lease =~ /^\d+$/, 'an external step is claimed');
my $id = $node->safe_psql('postgres', q{SELECT dwarf.create('call', '{"x": 1}')});
ok($node->poll_query_until('postgres',
	"SELECT state FROM dwarf.external_steps('dwarf.http') WHERE flow_id = $id", 'leased'),
	'the HTTP process leases the call');
my %refused;
for my $try (map { $lease + $_ } 1 .. 5)
{
	for my $sql ("SELECT dwarf.complete($try, '{\"forged\": true}')",
		"SELECT dwarf.fail($try, 'forged')",
		"SELECT dwarf.extend($try, '1 hour')")
	{
		my ($rc, $out, $err) = $node->psql('postgres', $sql);
		if ($err =~ /lease $try is of an HTTP call \(queue "dwarf.http"\), which only dwarf's HTTP process answers\n.*DETAIL:  The step is task "a" of flow $id\./)
		{
			(my $fn = $sql) =~ s/^SELECT (dwarf\.\w+).*/$1/;
			$refused{$fn}++;
		}
	}
}
is_deeply(\%refused, { 'dwarf.complete' => 1, 'dwarf.fail' => 1, 'dwarf.extend' => 1 },
	'dwarf.complete, dwarf.fail and dwarf.extend refuse the HTTP call\'s lease, saying so');
is(outcome($id), 'completed|{"x": 1, "slept": 4000}', 'the call\'s own answer completes the step');
$node->safe_psql('postgres', "SELECT dwarf.complete($lease)");
like(outcome($outside), qr/^completed/, 'an external step\'s lease is still answered as before');

# ------------------------------------------------------------------ 2. a failed flow leaves no offer
my @ok = map { "ok$_" } 1 .. 9;
my $tasks = join(', ', qq{"bad": {"http": "POST $base/status/404"}},
	map { qq{"$_": {"http": "POST $base/ok/$_"}} } @ok);
my $to = join(', ', map { qq{"$_"} } 'bad', @ok);
$node->safe_psql('postgres', qq{SELECT dwarf.define('fails', '{"tasks": {"start": "app.noop", $tasks},
	"transitions": [{"from": "start", "to": [$to]}]}')});
my $leftover = 0;
for my $round (1 .. 3)
{
	$id = $node->safe_psql('postgres', q{SELECT dwarf.create('fails', '{}')});
	like(outcome($id), qr/^failed\|/, "round $round: the flow fails on the 404");
	# give the workers' sweeps time to do what they would
	sleep 2;
	my $left = $node->safe_psql('postgres',
		"SELECT count(*) || ' ' || coalesce(string_agg(DISTINCT state, ','), '') FROM dwarf.external_steps('dwarf.http') WHERE flow_id = $id");
	is($left, '0 ', "round $round: the failed flow holds no offer of dwarf.http");
}

$server->kill_kill;
stop_node($node, $t0);
done_testing();
