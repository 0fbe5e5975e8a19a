# Copyright: dwarf project.
#
# 187_monitoring.pl: the operator's tools in monitoring/ work on a real
# server, with the real exporter and the real promtool (Debian's
# prometheus-postgres-exporter and prometheus, installed by scripts/deps.sh).
#
#  1. 20 flows of graph "pay" complete and 5 fail; then they are purged from
#     the live tables; a flow of graph "refund" waits for dwarf.resume;
#  2. prometheus-postgres-exporter, run with monitoring/postgres_exporter.yaml
#     and connected as a pg_monitor member that owns no flow, exports
#     dwarf_flows_completed_total{database="postgres",graph="pay"} 20 and
#     failed 5 (counters, not live-table counts), every dwarf series with
#     its database label, the flow and step duration histograms whose
#     le="+Inf" bucket equals _count, the age of the waiting flow, a finite
#     maintain age after a dwarf.maintain() pass, the step log's live and
#     archived segments as dwarf.storage counts them, and no query error;
#  3. every metric that monitoring/dashboard.json and monitoring/alerts.yml
#     name is in that scrape, and every dashboard query names one;
#  4. promtool check rules passes on monitoring/alerts.yml.
# The exporter is stopped at the end, and on failure (END block).
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

my $t0         = time;
my $monitoring = "$FindBin::Bin/../monitoring";
my $exporter_bin = '/usr/bin/prometheus-postgres-exporter';
my $exporter;

# Whatever happens, the exporter does not outlive the test.
END
{
	$exporter->kill_kill if $exporter;
}

my $node = new_node('monitoring');
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.charge(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF (s->>'fail')::boolean THEN
		RAISE EXCEPTION 'card declined';
	END IF;
	RETURN '{"charged": true}';
END $$;
CREATE FUNCTION app.ship(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"shipped": true}'::jsonb $$;
CREATE FUNCTION app.ask(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT coalesce(dwarf.interrupt('{"question": "refund?"}'), '{}') $$;
SELECT dwarf.define('pay', '{"tasks": {"charge": "app.charge", "ship": "app.ship"},
                             "transitions": [{"chain": ["charge", "ship", "END"]}]}');
SELECT dwarf.define('refund', '{"tasks": {"ask": "app.ask"}}');
CREATE ROLE dwarf_exporter LOGIN IN ROLE pg_monitor;
});
wait_for_workers($node, 'two workers run');

# 1. 20 flows complete and 5 fail, then leave the live tables.
$node->safe_psql('postgres',
	q{SELECT dwarf.create('pay', jsonb_build_object('n', i, 'fail', i > 20))
	    FROM generate_series(1, 25) i});
wait_flows_closed($node, 'postgres', 'the 25 flows closed');
is( $node->safe_psql('postgres',
		"SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
		   FROM (SELECT status, count(*) n FROM dwarf.flow GROUP BY status) s"),
	'completed=20 failed=5', '20 flows completed and 5 failed');

is($node->safe_psql('postgres', q{SELECT dwarf.purge(older_than => '0 s')}),
	'25', 'dwarf.purge deletes the 25 closed flows');
$node->safe_psql('postgres', 'SELECT dwarf.maintain()');

# A flow that waits for an approval: an interrupted flow of graph "refund".
$node->safe_psql('postgres', q{SELECT dwarf.create('refund', '{}')});
ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE status = 'interrupted'", '1'),
	'a flow of graph refund waits for dwarf.resume');

# 2. The exporter, on a free loopback port, connected as the pg_monitor member,
# with its own default metrics too (they need no more than pg_monitor): the
# file must work beside them.
my $port    = PostgreSQL::Test::Cluster::get_free_port();
my $metrics = "http://127.0.0.1:$port/metrics";
my $log     = "$PostgreSQL::Test::Utils::log_path/187_exporter.log";
{
	local $ENV{DATA_SOURCE_NAME} = sprintf('host=%s port=%d dbname=postgres user=dwarf_exporter sslmode=disable',
		$node->host, $node->port);
	$exporter = IPC::Run::start(
		[
			$exporter_bin,
			"--web.listen-address=127.0.0.1:$port",
			"--extend.query-path=$monitoring/postgres_exporter.yaml"
		],
		'<', \undef, '>&', $log);
}

# Scrapes until the exporter answers with dwarf's series (bounded).
my $web = HTTP::Tiny->new(timeout => 10);
my $scrape;
my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
while (time < $deadline)
{
	my $r = $web->get($metrics);
	if ($r->{success} && $r->{content} =~ /^dwarf_flows_completed_total\{/m)
	{
		$scrape = $r->{content};
		last;
	}
	last unless $exporter->pumpable;    # it exited
	select(undef, undef, undef, 0.2);
}
ok(defined $scrape, 'the exporter answers /metrics with dwarf_flows_completed_total')
  or diag slurp_file($log);
$scrape //= '';
append_to_file("$PostgreSQL::Test::Utils::log_path/187_scrape.txt", $scrape);

# The scrape as [name, {label => value}, value] triples.
my @series;
for my $line (split /\n/, $scrape)
{
	next if $line =~ /^#/ || $line !~ /\S/;
	my ($name, $labels, $value) = $line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/
	  or next;
	my %l = ($labels // '') =~ /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
	push @series, [ $name, \%l, $value ];
}
my %names = map { $_->[0] => 1 } @series;

# The value of the one series $name whose labels include %want (undef if none).
sub value_of
{
	my ($name, %want) = @_;
	my @hits = grep {
		my $s = $_;
		$s->[0] eq $name && !grep { ($s->[1]{$_} // "\0") ne $want{$_} } keys %want
	} @series;
	return @hits == 1 ? $hits[0][2] : undef;
}

my %pay = (database => 'postgres', graph => 'pay');
is(value_of('dwarf_flows_completed_total', %pay), 20,
	'dwarf_flows_completed_total{database="postgres",graph="pay"} is 20 after the purge');
is(value_of('dwarf_flows_failed_total', %pay), 5,
	'dwarf_flows_failed_total{graph="pay"} is 5');
is(value_of('dwarf_flows_created_total', %pay), 25,
	'dwarf_flows_created_total{graph="pay"} is 25');
is(value_of('dwarf_task_steps_failed_total', %pay, task => 'charge'), 5,
	'dwarf_task_steps_failed_total{task="charge"} is 5');
like($scrape, qr/^# TYPE dwarf_flows_completed_total counter$/m, 'the completed flows are a counter');
like($scrape, qr/^# HELP dwarf_flows_completed_total Flows of the graph that completed$/m,
	'with its description');
is( $node->safe_psql('postgres',
		"SET ROLE dwarf_exporter; SELECT flows_completed || ' ' || flows_failed FROM dwarf.graph_stats WHERE graph = 'pay'"),
	'20 5', 'the pg_monitor member sees 20 and 5 in dwarf.graph_stats too');

# Histograms: typed as such, +Inf equal to _count, buckets never decreasing.
for my $h ([ 'dwarf_flow_duration_seconds', %pay ],
	[ 'dwarf_step_duration_seconds', %pay, task => 'ship' ])
{
	my ($name, %labels) = @$h;
	like($scrape, qr/^# TYPE \Q$name\E histogram$/m, "$name is a histogram");
	my $count = value_of("${name}_count", %labels);
	ok(defined $count && $count > 0, "${name}_count of graph pay is set ($count)");
	is(value_of("${name}_bucket", %labels, le => '+Inf'), $count,
		"${name}_bucket{le=\"+Inf\"} equals ${name}_count");
	ok(defined value_of("${name}_sum", %labels), "${name}_sum is there");
	my @buckets = sort { $a->[0] <=> $b->[0] }
	  map { [ $_->[1]{le} eq '+Inf' ? 9**9**9 : $_->[1]{le}, $_->[2] ] }
	  grep {
		my $s = $_;
		$s->[0] eq "${name}_bucket" && !grep { $s->[1]{$_} ne $labels{$_} } keys %labels
	  } @series;
	ok(@buckets > 1 && !grep({ $buckets[$_][1] < $buckets[ $_ - 1 ][1] } 1 .. $#buckets),
		"${name}'s buckets are cumulative (" . scalar(@buckets) . ' of them)');
}
is(value_of('dwarf_flow_duration_seconds_count', %pay), 25,
	'the flow histogram counts the 25 closed flows');

my $age = value_of('dwarf_health_maintain_age_seconds', database => 'postgres');
ok(defined $age && $age ne '+Inf' && $age >= 0,
	'dwarf_health_maintain_age_seconds is finite after a dwarf.maintain() pass (' . ($age // 'none') . ')');
is(value_of('dwarf_health_runners_max', database => 'postgres'),
	$node->safe_psql('postgres', 'SELECT runners_max FROM dwarf.health WHERE graph IS NULL'),
	'dwarf_health_runners_max is the health view\'s runners_max');
is( join(' ', map { value_of("dwarf_storage_$_", database => 'postgres') // 'none' }
		qw(live_segments archived_segments)),
	$node->safe_psql('postgres', q{SELECT live_segments || ' ' || archived_segments FROM dwarf.storage}),
	'dwarf_storage_live_segments and _archived_segments are dwarf.storage\'s counts of the step log\'s segments');
my $waited = value_of('dwarf_graph_oldest_interrupted_seconds', database => 'postgres', graph => 'refund');
ok(defined $waited && $waited > 0,
	'dwarf_graph_oldest_interrupted_seconds{graph="refund"} shows the waiting flow (' . ($waited // 'none') . ')');
is(value_of('dwarf_graph_oldest_interrupted_seconds', %pay), 0,
	'and is 0 for graph pay, which has no open flow');

my @unlabelled = grep { $_->[0] =~ /^dwarf_/ && ($_->[1]{database} // '') ne 'postgres' } @series;
is(scalar @unlabelled, 0, 'every dwarf series has database="postgres"')
  or diag join("\n", map { $_->[0] } @unlabelled);
is(value_of('pg_exporter_last_scrape_error'), 0, 'no query failed, of the file or the default ones');
ok(defined value_of('pg_up'), 'the default metrics are there too');
is(value_of('pg_exporter_user_queries_load_error'), 0, 'the exporter loaded the file');
unlike(slurp_file($log), qr/level=error/, 'the exporter logged no error')
  or diag slurp_file($log);

# 3. The dashboard's queries and the rules' expressions name exported metrics.
my $dashboard = decode_json(slurp_file("$monitoring/dashboard.json"));
my @queries;
for my $panel (@{ $dashboard->{panels} })
{
	push @queries, map { $_->{expr} } @{ $panel->{targets} // [] };
}
push @queries, map { ref $_->{query} ? $_->{query}{query} : $_->{query} }
  grep { $_->{type} eq 'query' } @{ $dashboard->{templating}{list} // [] };
ok(@queries >= 8, 'the dashboard has queries (' . scalar(@queries) . ')');
is(scalar(grep { !/\bdwarf_[a-z0-9_]+/ } @queries), 0, 'every dashboard query names a dwarf metric');

my %used;
$used{$_}{dashboard} = 1 for map { /\b(dwarf_[a-z0-9_]+)/g } @queries;
$used{$_}{alerts} = 1 for slurp_file("$monitoring/alerts.yml") =~ /\b(dwarf_[a-z0-9_]+)/g;
my @missing = grep { !$names{$_} } sort keys %used;
is(scalar @missing, 0,
	'every metric the dashboard and the alert rules name is in the scrape (' . scalar(keys %used) . ')')
  or diag 'missing: ' . join(', ', map { "$_ (" . join('+', sort keys %{ $used{$_} }) . ')' } @missing);

# 4. promtool accepts the rules.
my ($out, $err) = ('', '');
ok(IPC::Run::run([ 'promtool', 'check', 'rules', "$monitoring/alerts.yml" ], '<', \undef, '>', \$out, '2>', \$err),
	'promtool check rules monitoring/alerts.yml exits 0')
  or diag "$out$err";
like($out, qr/SUCCESS: [1-9]\d* rules found/, 'promtool found the rules');

$exporter->kill_kill;
undef $exporter;
check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
