# Copyright: dwarf project.
#
# 183_http_tasks.pl: HTTP tasks ({"http": "POST http://host/path"}), called
# by the server's own HTTP process, against test/http_server.py on loopback.
#
#  1. a 2xx JSON object answer is the step's changes; the request carries the
#     flow's state as its body, Idempotency-Key (the step key), Dwarf-Flow,
#     Dwarf-Task, Dwarf-Attempt, and the task's headers, one taken from the
#     flow's baggage; an empty answer is no changes; GET sends no body;
#  2. a 503 answered once is retried under the task's policy and succeeds,
#     both requests with the same Idempotency-Key;
#  3. a 404 fails the step at once with "404" in the error (its on_error
#     edge gets it); a 20 MB answer, a 302 and a non-object fail with clear
#     errors; a call past its timeout fails;
#  4. a URL outside dwarf.http_allow, and a flow whose owner lacks EXECUTE on
#     dwarf.http_call, fail without any request; with EXECUTE granted the
#     call is made; dwarf.claim refuses dwarf's own queue; dwarf.define
#     refuses a bad method or URL;
#  5. a server crash with calls in flight: after recovery each is made
#     again with the same Idempotency-Key, and each flow completes once.
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

my $node = new_node('http_tasks',
	'dwarf.min_retry_delay' => 0,
	'dwarf.http_allow'      => "'$base/'",
	'dwarf.http_max_response' => "'1MB'");

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app, dwarf TO alice, bob;
GRANT EXECUTE ON FUNCTION dwarf.http_call(text) TO alice;
CREATE FUNCTION app.handle(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('handled', s->'onErr'->>'message') $$;
});
wait_for_workers($node, 'two workers run');
ok($node->poll_query_until('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf http'", '1'),
	'the HTTP process runs, dwarf.http_allow being set');

# psql as $role, returning the output of $sql.
sub as
{
	my ($role, $sql) = @_;
	return $node->safe_psql('postgres', $sql, extra_params => [ '-U', $role ]);
}

# Defines graph $name as $role: task "call" ($spec, JSON), whose failure
# goes to app.handle.
sub define
{
	my ($role, $name, $spec) = @_;
	as($role, qq{SELECT dwarf.define('$name', '{"tasks": {"call": $spec, "handle": "app.handle"},
		"transitions": [{"chain": ["call", "END"]},
			{"from": "call", "to": "handle", "on_error": true}, {"from": "handle", "to": "END"}]}')});
}

# Creates a flow of $graph as $role; returns its id.
sub new_flow
{
	my ($role, $graph, $input, $baggage) = @_;
	$baggage = defined $baggage ? "'$baggage'" : 'NULL';
	return as($role, qq{SELECT dwarf.create('$graph', '$input', baggage => $baggage)});
}

# The outcome of a flow once closed: "status|state".
sub outcome
{
	my ($id, $role) = @_;
	return as($role // 'alice', qq{SET statement_timeout = '60 s';
		SELECT status || '|' || coalesce(state::text, '') FROM dwarf.await($id, '50 s')});
}

# The flow's step rows: "task:status:attempt" in order, comma-separated.
sub history
{
	my ($id) = @_;
	return $node->safe_psql('postgres', qq{SELECT string_agg(task || ':' || status || ':' || attempt, ',' ORDER BY step_id)
		FROM dwarf.step WHERE flow_id = $id});
}

# What the flow's state says at $path (a jsonb path like '{headers,x}').
sub state_at
{
	my ($id, $path) = @_;
	return $node->safe_psql('postgres', qq{SELECT state #>> '$path' FROM dwarf.flow WHERE id = $id});
}

# ------------------------------------------------------------------ 1. success
define('alice', 'echo', qq{{"http": {"method": "POST", "url": "$base/echo",
	"headers": {"X-Api-Key": {"baggage": "api_key"}, "X-Static": "s"}}, "timeout": "20 s"}});
my $id = new_flow('alice', 'echo', '{"a": 1}', '{"api_key": "sekrit"}');
like(outcome($id), qr/^completed\|/, 'an HTTP step completes the flow');
is(state_at($id, '{headers,idempotency-key}'), "$id-0-0-call", 'Idempotency-Key is the step key');
is(state_at($id, '{headers,dwarf-flow}') . ' ' . state_at($id, '{headers,dwarf-task}') . ' '
	  . state_at($id, '{headers,dwarf-attempt}'),
	"$id call 1", 'Dwarf-Flow, Dwarf-Task and Dwarf-Attempt name the step');
is(state_at($id, '{headers,x-api-key}'), 'sekrit', "a header takes its value from the flow's baggage");
is(state_at($id, '{headers,x-static}'), 's', "the task's own header is sent");
is(state_at($id, '{headers,content-type}'), 'application/json', 'the body is JSON');
is(state_at($id, '{body}'), '{"a": 1}', "the body is the flow's state");
is(state_at($id, '{method}'), 'POST', 'the method is the task\'s');
is(history($id), 'call:completed:1', 'one step row');
unlike($node->safe_psql('postgres', qq{SELECT definition::text FROM dwarf.graph WHERE name = 'echo'}),
	qr/sekrit/, 'the secret is not in the graph');

define('alice', 'empty', qq{{"http": "POST $base/empty"}});
$id = new_flow('alice', 'empty', '{"a": 2}');
is(outcome($id), 'completed|{"a": 2}', 'an empty answer is no changes');

define('alice', 'get', qq{{"http": "GET $base/echo"}});
$id = new_flow('alice', 'get', '{"a": 3}');
like(outcome($id), qr/^completed\|/, 'a GET completes');
is($node->safe_psql('postgres', qq{SELECT (state->>'method') || ' ' || (coalesce(state->'body', 'null') = 'null')::text FROM dwarf.flow WHERE id = $id}),
	'GET true', 'a GET sends no body');

# ------------------------------------------------------------------ 2. 503 once, then success
define('alice', 'flaky', qq{{"http": "POST $base/fail/1", "retry": {"attempts": 3, "initial": "10 ms"}}});
$id = new_flow('alice', 'flaky', '{}');
like(outcome($id), qr/^completed\|\{"attempts": 2\}/, 'a 503 once is retried and succeeds');
is(history($id), 'call:retry:1,call:completed:2', 'the failed attempt is a retry row');
my $keys = stats()->{keys}{'/fail/1'};
is_deeply($keys, [ "$id-0-0-call", "$id-0-0-call" ], 'both requests have the same Idempotency-Key');
like($node->safe_psql('postgres', qq{SELECT error->>'message' FROM dwarf.step WHERE flow_id = $id AND status = 'retry'}),
	qr/HTTP 503 .*busy, try again/, "the retry row's error names the status and the body");

# A Retry-After longer than the policy's backoff is the backoff.
define('alice', 'patient', qq{{"http": "POST $base/fail/1/2", "retry": {"attempts": 3, "initial": "10 ms"}}});
$id = new_flow('alice', 'patient', '{}');
like(outcome($id), qr/^completed\|\{"attempts": 2\}/, 'a 503 with Retry-After: 2 is retried and succeeds');
is($node->safe_psql('postgres', qq{SELECT wake_at - finished_at >= interval '2 s' FROM dwarf.step
	WHERE flow_id = $id AND status = 'retry'}), 't', 'the retry waits as long as Retry-After says');

# ------------------------------------------------------------------ 3. failures
define('alice', 'missing', qq{{"http": "POST $base/status/404", "retry": {"attempts": 3, "initial": "10 ms"}}});
$id = new_flow('alice', 'missing', '{}');
like(outcome($id), qr/^completed\|.*"handled": "HTTP 404 from POST \Q$base\E\/status\/404: status 404 here"\}/,
	'a 404 fails the step, its on_error edge gets the error with "404"');
is(history($id), 'call:failed:1,handle:completed:1', 'a 404 is not retried');
is(stats()->{by_path}{'/status/404'}, 1, 'one request for the 404');

define('alice', 'big', qq{{"http": "POST $base/big/20"}});
$id = new_flow('alice', 'big', '{}');
like(outcome($id), qr/"handled": "the answer of POST \Q$base\E\/big\/20 is larger than dwarf.http_max_response \(1024 kB\)"/,
	'a 20 MB answer fails with a clear error');

define('alice', 'moved', qq{{"http": "POST $base/redirect"}});
$id = new_flow('alice', 'moved', '{}');
like(outcome($id), qr/"handled": "HTTP 302 from POST \Q$base\E\/redirect: redirects are not followed \(to \Q$base\E\/ok\)"/,
	'a 302 fails with a clear error, not followed');
is(stats()->{by_path}{'/ok'}, undef, 'the redirect was not followed');

define('alice', 'array', qq{{"http": "POST $base/array"}});
$id = new_flow('alice', 'array', '{}');
like(outcome($id), qr/"handled": "HTTP 200 from POST \Q$base\E\/array: the answer is not a JSON object: \[1, 2\]"/,
	'an answer that is not an object fails');

define('alice', 'slow', qq{{"http": "POST $base/delay/20000", "timeout": "1 s"}});
$id = new_flow('alice', 'slow', '{}');
like(outcome($id), qr/"handled": "POST \Q$base\E\/delay\/20000 timed out after 1000 ms"/,
	'a call past its timeout fails');

# ------------------------------------------------------------------ 4. safety
define('alice', 'outside', qq{{"http": "POST http://localhost:$port/ok/outside"}});
$id = new_flow('alice', 'outside', '{}');
like(outcome($id), qr/"handled": "http:\/\/localhost:$port\/ok\/outside is not inside dwarf.http_allow/,
	'a URL outside dwarf.http_allow fails');
is(stats()->{by_path}{'/ok/outside'}, undef, '... without a request');

define('bob', 'bobs', qq{{"http": "POST $base/ok/bob"}});
$id = new_flow('bob', 'bobs', '{}');
like(outcome($id, 'bob'), qr/"handled": "the owner of flow $id \(bob\) may not make HTTP calls: it needs EXECUTE on dwarf.http_call\(text\)"/,
	'a flow whose owner lacks EXECUTE on dwarf.http_call fails');
is(stats()->{by_path}{'/ok/bob'}, undef, '... without a request');
$node->safe_psql('postgres', 'GRANT EXECUTE ON FUNCTION dwarf.http_call(text) TO bob');
$id = new_flow('bob', 'bobs', '{}');
like(outcome($id, 'bob'), qr/^completed\|\{"got": \{\}, "called": 1\}/, 'with EXECUTE granted, the call is made');
is(as('alice', "SELECT dwarf.http_call('$base/x')::text || ' ' || dwarf.http_call('http://localhost/x')::text"),
	'true false', 'dwarf.http_call says which URLs are allowed');

my ($rc, $out, $err) = $node->psql('postgres', q{SELECT * FROM dwarf.claim('dwarf.http')});
like($err, qr/queue "dwarf.http" is dwarf's own/, "dwarf.claim refuses dwarf's own queue");
($rc, $out, $err) = $node->psql('postgres', q{SELECT dwarf.define('bad', '{"tasks": {"a": {"http": "FETCH http://x/"}}, "transitions": [{"chain": ["a", "END"]}]}')});
like($err, qr/"FETCH" is not a method task "a" may call with/, 'dwarf.define refuses a bad method');
($rc, $out, $err) = $node->psql('postgres', q{SELECT dwarf.define('bad', '{"tasks": {"a": {"http": "POST ftp://x/"}}, "transitions": [{"chain": ["a", "END"]}]}')});
like($err, qr/"ftp:\/\/x\/" is not a URL task "a" may call/, 'dwarf.define refuses a URL that is not http or https');
($rc, $out, $err) = $node->psql('postgres', q{SELECT dwarf.define('bad', '{"tasks": {"a": {"external": "dwarf.http"}}, "transitions": [{"chain": ["a", "END"]}]}')});
like($err, qr/"dwarf.http" cannot name the queue/, "an external task may not name dwarf's own queue");

# ------------------------------------------------------------------ 5. a crash with calls in flight
define('alice', 'long', qq{{"http": "POST $base/delay/3000", "timeout": "60 s"}});
my @ids = map { new_flow('alice', 'long', qq{{"n": $_}}) } 1 .. 5;
for (my $waited = 0; (stats()->{by_path}{'/delay/3000'} // 0) < 5 && $waited < 600; $waited++)
{
	select(undef, undef, undef, 0.1);
}
is(stats()->{by_path}{'/delay/3000'}, 5, 'five calls are in flight');
$node->stop('immediate');
$node->start;
for my $i (@ids)
{
	like(outcome($i), qr/^completed\|\{"n": \d, "slept": 3000\}/, "flow $i completes after the crash");
}
$keys = stats()->{keys}{'/delay/3000'};
my %count;
$count{$_ // 'none'}++ for @$keys;
is_deeply(\%count, { map { ("$_-0-0-call" => 2) } @ids },
	'each call was made again after the crash, with the same Idempotency-Key');
is($node->safe_psql('postgres', "SELECT count(*) FROM dwarf.step WHERE flow_id IN (" . join(',', @ids) . ")"),
	'5', 'each flow has its one step');

$server->kill_kill;
stop_node($node, $t0);
done_testing();
