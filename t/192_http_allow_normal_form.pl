# Copyright: dwarf project.
#
# 192_http_allow_normal_form.pl: dwarf.http_allow is a gate, not a string
# prefix.  With "$base/ok/" allowed, no spelling of a URL outside it reaches
# the test server (test/http_server.py): dot-segments ("../"), encoded ones
# ("%2e%2e/", "%2E%2e/" in a mixed-case URL), a port that merely starts
# like an allowed one; user information and a dot-segment behind an
# encoded slash are refused at define.  An allowed URL written oddly
# (upper-case scheme and host, "./", "../" inside the prefix, escaped
# unreserved characters) is called in its normal form, exactly.  The
# server's http_proxy environment is not used.  dwarf.http_call compares in
# normal form too (default ports, case, segment boundary), and a prefix
# that has no normal form is refused when set.
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

# A prefix that is a string prefix of $base, but names another port.
my $short_port = substr($port, 0, length($port) - 1);

# The server starts with proxy variables that point nowhere: curl would
# send every call to them, and fail, if dwarf let it read them.
my $node;
{
	local $ENV{http_proxy}  = 'http://127.0.0.1:9';
	local $ENV{HTTPS_PROXY} = 'http://127.0.0.1:9';
	local $ENV{ALL_PROXY}   = 'http://127.0.0.1:9';
	local $ENV{no_proxy};
	local $ENV{NO_PROXY};
	$node = new_node('http_allow',
		'dwarf.min_retry_delay' => 0,
		'dwarf.http_allow' => "'$base/ok/, http://127.0.0.1:$short_port, https://API.Example.test:443/v1'");
}
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app, dwarf TO alice;
GRANT EXECUTE ON FUNCTION dwarf.http_call(text) TO alice;
CREATE FUNCTION app.handle(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('handled', s->'onErr'->>'message') $$;
});
wait_for_workers($node, 'two workers run');
ok($node->poll_query_until('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf http'", '1'),
	'the HTTP process runs');

sub as
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql, extra_params => [ '-U', 'alice' ]);
}

# Defines graph $name: task "call" calls $url (POST), its failure goes to
# app.handle.  Returns psql's (rc, stderr).
sub define
{
	my ($name, $url) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.define('$name', '{"tasks": {"call": {"http": "POST $url", "timeout": "20 s"}, "handle": "app.handle"},
		"transitions": [{"chain": ["call", "END"]},
			{"from": "call", "to": "handle", "on_error": true}, {"from": "handle", "to": "END"}]}')},
		extra_params => [ '-U', 'alice' ]);
	return ($rc, $err);
}

# Runs a flow of $name; its outcome "status|state".
sub run_flow
{
	my ($name) = @_;
	my $id = as(qq{SELECT dwarf.create('$name', '{"x": 1}')});
	return as(qq{SET statement_timeout = '60 s';
		SELECT status || '|' || coalesce(state::text, '') FROM dwarf.await($id, '50 s')});
}

$web->get("$base/reset");

# ------------------------------------------------------------------ bypasses
my %outside = (
	dots        => "$base/ok/../echo",
	encoded     => "$base/ok/%2e%2e/echo",
	mixed_case  => "HtTp://127.0.0.1:$port/ok/%2E%2e/echo",
	deep        => "$base/ok/a/b/../../../echo",
	port_prefix => "http://127.0.0.1:$port/echo",
	other_host  => "http://localhost:$port/ok/x");
for my $name (sort keys %outside)
{
	my ($rc, $err) = define($name, $outside{$name});
	is($rc, 0, "$name: $outside{$name} is a URL define takes") or diag($err);
	like(run_flow($name), qr/^completed\|.*"handled": ".* is not inside dwarf.http_allow: HTTP task \\"call\\" may not call it"/,
		"$name: the step fails as outside dwarf.http_allow");
}
like(run_flow('dots'), qr/"handled": "\Q$base\E\/echo is not inside/,
	'the error names the URL in normal form');

my ($rc, $err) = define('userinfo', "http://user:secret\@127.0.0.1:$port/ok/x");
like($err, qr/is not a URL task "call" may call.*\n.*DETAIL:  The URL cannot be used: it has user information/,
	'define refuses user information, saying so');
($rc, $err) = define('userinfo2', "http://127.0.0.1:$port\@localhost:$port/ok/x");
like($err, qr/it has user information/, '... also where it looks like a port');
($rc, $err) = define('slash', "$base/ok/..%2Fecho");
like($err, qr/DETAIL:  The URL cannot be used: its path has a dot-segment next to an encoded slash/,
	'define refuses a dot-segment behind an encoded slash');
($rc, $err) = define('badescape', "$base/ok/%zz");
like($err, qr/not followed by two hex digits/, 'define refuses a bad escape');

is(stats()->{requests}, 0, 'the test server saw no request at all for the URLs outside');

# ------------------------------------------------------------------ allowed, in normal form
($rc, $err) = define('odd', "HTTP://127.0.0.1:$port/ok/./a/../%61llowed%2fx?%7e=1#frag");
is($rc, 0, 'an allowed URL written oddly is defined') or diag($err);
like(run_flow('odd'), qr/^completed\|\{"x": 1, "got": \{"x": 1\}, "called": 1\}$/,
	'an allowed URL written oddly is called, despite the proxy variables');
is_deeply([ sort keys %{ stats()->{by_path} } ], ['/ok/allowed%2Fx?~=1'],
	'the server saw exactly the normal form, and nothing else');

# ------------------------------------------------------------------ dwarf.http_call
my @calls = (
	[ 'https://api.example.test/v1/x',          't', 'the prefix itself in normal form' ],
	[ 'HTTPS://API.EXAMPLE.TEST:443/v1/x',      't', 'case of scheme and host, default port' ],
	[ 'https://api.example.test/v1',            't', 'the prefix exactly' ],
	[ 'https://api.example.test/v1?q=1',        't', 'a query after the prefix' ],
	[ 'https://api.example.test/v1x',           'f', 'not at a segment boundary' ],
	[ 'https://api.example.test:444/v1/x',      'f', 'another port' ],
	[ 'http://api.example.test/v1/x',           'f', 'another scheme (its default port)' ],
	[ 'https://api.example.test/v1/../v2',      'f', 'dot-segments out of the prefix' ],
	[ 'https://api.example.test/v2/../v1/x',    't', 'dot-segments into the prefix' ],
	[ 'https://u@api.example.test/v1/x',        'f', 'user information' ],
	[ 'https://api.example.test.evil.net/v1/x', 'f', 'a longer host' ],
	[ "http://127.0.0.1:$short_port/x",         't', 'a prefix without a path is its host\'s root' ],
	[ "http://127.0.0.1:${short_port}0/x",      'f', '... and no other port' ]);
for my $c (@calls)
{
	is(as("SELECT dwarf.http_call('$c->[0]')"), $c->[1], "dwarf.http_call: $c->[2] ($c->[0])");
}

# ------------------------------------------------------------------ the setting's check
($rc, my $out, $err) = $node->psql('postgres', q{ALTER SYSTEM SET dwarf.http_allow = 'https://ok.example/, https://user:pw@bad.example/'});
like($err, qr/invalid value for parameter "dwarf.http_allow".*\n.*DETAIL:  Prefix "https:\/\/user:pw\@bad.example\/" cannot be used: it has user information/,
	'a prefix with user information is refused when set');

$server->kill_kill;
stop_node($node, $t0);
done_testing();
