# Copyright: dwarf project.
#
# 070_fuzz.pl: thousands of random inputs, and the server neither crashes nor
# answers any of them with an internal error.
#
# With a fixed seed (DWARF_FUZZ_SEED overrides it; DWARF_FUZZ_INPUTS sets the
# number of inputs, 3000; DWARF_FUZZ_KINDS=create,run,... keeps only those
# kinds, to narrow a failure down), the test generates random statements and
# runs them in batches, two psql sessions at a time, while a reaper cancels
# flows that loop for ever.  Each statement runs through fuzz.try(), which
# catches its error and records the SQLSTATE and message, so one refusal
# does not stop the rest.  The statements are:
#
#  - graph definitions for dwarf.define and dwarf.validate: random graphs of
#    0 to 50 tasks with every kind of edge and field (from, to, when, switch,
#    for_each, as, goto, on_error, chain, fan_in, reducers, entry), most
#    valid, the others mutated: wrong types, nulls, deep nesting, unknown or
#    wrongly typed functions, odd task names (unicode, control characters,
#    END, 64 bytes), bad paths; and a few built in SQL with up to 100,000
#    tasks or targets;
#  - flows: dwarf.create and dwarf.run of a pool of valid random graphs with
#    random inputs and options (priorities, idempotency keys, fairness,
#    time budgets, baggage, threads, delete_on_completion), so that the
#    workers run random steps of random task functions: ones that do
#    nothing, raise, return a non-object, sleep, retry, goto, interrupt,
#    start subgraphs, return odd or huge JSON, run a random statement inside
#    the task (cancel or delete their own flow, dwarf.run, temporary tables,
#    COMMIT, ...), or whose function is dropped and created again meanwhile;
#  - every other dwarf function with random arguments: NULLs, negative and
#    huge ids, out-of-range and negative intervals, non-object JSON, big
#    values; the task-only functions outside a task; statements that mix
#    create, cancel, resume, delete and define in one transaction.
#
# Then it checks that:
#  - the server never crashed (no crash in the log, the same postmaster,
#    checkpointer and dwarf workers as at the start);
#  - no refusal and no failed step has an internal SQLSTATE (XX000, XX001,
#    XX002) except the documented poison-step error, no refusal has an empty
#    message, and no internal error reached the server log; the offending
#    input is printed;
#  - no dwarf WARNING reached the server log (a worker that cannot replay a
#    flow's recorded steps rebuilds it wrongly);
#  - every flow the fuzzer started ends: it completes or fails, or it sleeps,
#    waits for a child or is interrupted on purpose (those are cancelled),
#    or it loops through its conditions (also cancelled); a flow that could
#    run and does not is a hang;
#  - every stored flow and step row can be read back;
#  - a valid control flow still completes with the right state, and both
#    workers still run.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use Encode qw(encode_utf8);
use IPC::Run;
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $t0      = time;
my $SEED    = $ENV{DWARF_FUZZ_SEED}   // 7070;
my $NINPUTS = $ENV{DWARF_FUZZ_INPUTS} // 3000;
die "DWARF_FUZZ_SEED must be a non-negative integer\n"   unless $SEED    =~ /^\d+$/;
die "DWARF_FUZZ_INPUTS must be a positive integer\n"     unless $NINPUTS =~ /^[1-9]\d*$/;
srand($SEED);
diag "fuzz seed $SEED ($NINPUTS inputs); rerun with DWARF_FUZZ_SEED=$SEED to repeat";

# ================================================================ randomness

sub rint   { int(rand($_[0])) }
sub chance { rand() < $_[0] }
sub pick   { $_[ rint(scalar @_) ] }

# wpick(value => weight, ...): a value, chosen with the given weights.
sub wpick
{
	my @pairs = @_;
	my $total = 0;
	for (my $i = 1; $i < @pairs; $i += 2) { $total += $pairs[$i]; }
	my $r = rand($total);
	for (my $i = 0; $i < @pairs; $i += 2)
	{
		$r -= $pairs[ $i + 1 ];
		return $pairs[$i] if $r < 0;
	}
	return $pairs[-2];
}

sub shuffle
{
	my @a = @_;
	for (my $i = $#a; $i > 0; $i--)
	{
		my $j = rint($i + 1);
		@a[ $i, $j ] = @a[ $j, $i ];
	}
	return @a;
}

# Printable ASCII at random: long enough, it does not compress.
sub rand_text
{
	my ($n) = @_;
	return join '', map { chr(33 + rint(94)) } 1 .. $n;
}

# ================================================================ JSON

# Objects are ordered lists of pairs (duplicates allowed: jsonb keeps the
# last); R() is a raw JSON token (numbers, true, false, or any text).
sub O { return bless [@_], 'FzObj'; }
sub R { my $s = "$_[0]"; return bless \$s, 'FzRaw'; }

sub jstr
{
	my ($s) = @_;
	$s =~ s/(["\\])/\\$1/g;
	$s =~ s/([\x00-\x1f])/sprintf('\\u%04x', ord($1))/ge;
	return "\"$s\"";
}

sub js
{
	my ($v) = @_;
	return 'null' unless defined $v;
	my $r = ref $v;
	return jstr($v) if $r eq '';
	return $$v if $r eq 'FzRaw';
	return '[' . join(', ', map { js($_) } @$v) . ']' if $r eq 'ARRAY';
	die "cannot encode $r" unless $r eq 'FzObj';
	my @p = @$v;
	my @out;
	while (@p)
	{
		my ($k, $x) = splice(@p, 0, 2);
		push @out, jstr($k) . ': ' . js($x);
	}
	return '{' . join(', ', @out) . '}';
}

sub oset
{
	my ($o, $k, $v) = @_;
	for (my $i = 0; $i < @$o; $i += 2)
	{
		if ($o->[$i] eq $k) { $o->[ $i + 1 ] = $v; return $o; }
	}
	push @$o, $k, $v;
	return $o;
}

sub odel
{
	my ($o, $k) = @_;
	my @n;
	for (my $i = 0; $i < @$o; $i += 2)
	{
		push @n, $o->[$i], $o->[ $i + 1 ] unless $o->[$i] eq $k;
	}
	@$o = @n;
	return $o;
}

sub okeys
{
	my ($o) = @_;
	return map { $o->[ 2 * $_ ] } 0 .. $#$o / 2;
}

# SQL literals: standard_conforming_strings is on; NUL cannot be in text.
sub lit
{
	my ($s) = @_;
	return 'NULL' unless defined $s;
	$s =~ s/\x00//g;
	$s =~ s/'/''/g;
	return "'$s'";
}
sub jlit { return lit(js($_[0])) . '::jsonb'; }

# ================================================================ pools

my @WEIRD = (
	'', ' ', 'END', 'end', 'a', 'x' x 63, 'x' x 64, "\x{3A9}mega",
	"\x{65E5}\x{672C}\x{8A9E}", "\x{1F600}", "e\x{301}", "\x{202E}rtl", "tab\there",
	"new\nline", "\x01\x02", "\x7f", 'quote"', "apos'", 'back\\slash', '$fz$',
	'%', '_', '%s%n%s%n', 'a.b', 'fz.noop', 'null', '[]', '$.x', "\x{FEFF}bom",
	"\x{10FFFF}", ' lead', 'trail ', "nul\x00byte", 'T0', 'T1', 'k1');

# A random string: mostly from the pool, sometimes long, sometimes long and
# incompressible (past what a btree entry may hold).
sub wstr
{
	return 'y' x (1 + rint(3000)) if chance(0.06);
	return rand_text(3000 + rint(6000)) if chance(0.03);
	return pick(@WEIRD);
}

my @NUMS = (
	'0', '-0', '1', '-1', '3.14', '1e308', '-1e308', '1e1000', '1e-1000',
	'123456789012345678901234567890', '2147483648', '-9223372036854775809',
	'0.1e-5', '9e131071');

# Any JSON value.
sub rjson
{
	my ($depth) = @_;
	$depth //= 0;
	my $k = rint($depth > 2 ? 6 : 9);
	return undef                            if $k == 0;
	return R(pick('true', 'false'))         if $k == 1;
	return R(pick(@NUMS))                   if $k == 2;
	return wstr()                           if $k == 3;
	return pick(@WEIRD)                     if $k == 4;
	return R(rint(100))                     if $k == 5;
	return [ map { rjson($depth + 1) } 1 .. rint(4) ] if $k <= 7;
	return O(map { (pick(@WEIRD, 'k' . rint(5)), rjson($depth + 1)) } 1 .. rint(5));
}

sub deep_array { my $d = shift; return R(('[' x $d) . (']' x $d)); }
sub deep_object { my $d = shift; return R(('{"a": ' x $d) . '1' . ('}' x $d)); }

# Text that is not JSON, or JSON that jsonb refuses.
my @BAD_JSON = (
	'{"tasks": ', '{,}', '{"a": 1,}', "{'a': 1}", '', 'NaN', '{"a": 01}',
	'{"a": "\ud800"}', '{"a": "\u0000"}', '[' x 100000, '{"a": 1} x',
	'{"a": "\x"}', '"unterminated', '{"a": Infinity}', '{"a" 1}');

my @INTERVALS = (
	'1 ms', '0', '0 s', '10 ms', '1 s', '-1 s', '-1 us', '1 us', '1 hour',
	'100 years', '101 years', '36525 days', '36525 days 1 us', '36526 days',
	'-36525 days', '1 mon', '1200 mons', '1201 mons', '2147483647 days 2562047788 hours',
	'-2147483648 days', '178000000 years', '-178000000 years', '1 day -86401 s',
	'1 mon -31 days', 'P1Y2M3DT4H5M6S', '@ 1 minute ago', '00:00:00.000001',
	'infinity', '-infinity', 'NaN', 'garbage', '', '106751990 days',
	'1 mon -40 days', '30 s');

sub ival
{
	return 'NULL' if chance(0.08);
	return lit(pick(@INTERVALS)) . '::interval';
}

# ================================================================ graphs

my @TASK_FNS = (
	'fz.noop'   => 30, 'fz.nil'    => 3, 'fz.raise' => 6, 'fz.nonobj' => 3,
	'fz.sleeper' => 6, 'fz.retry'  => 5, 'fz.intr'  => 3, 'fz.sub'    => 3,
	'fz.odd'    => 6, 'fz.exec'   => 6, 'fz.eph'   => 3, 'fz.secret' => 1,
	'fz.snooze' => 1, 'fz.goto'   => 2, 'pg_catalog.jsonb_strip_nulls' => 1,
	'dwarf.validate' => 1, 'dwarf.interrupt' => 1);
my @BAD_FNS = (
	R(42), undef, [], O(), 'fz.nope', 'nope_schema.nope', '', 'a.b.c.d',
	'"unterminated', 'fz.takes_int', 'fz.returns_text', 'fz.srf', 'fz.proc',
	'fz.agg', 'fz.twoargs', 'pg_catalog.now', 'pg_catalog.jsonb_pretty',
	'FZ.NOOP', '"fz"."noop"', 'fz . noop', 'x' x 300, "fz.\x{1F600}",
	'dwarf.baggage', 'dwarf.subgraph', 'fz.noop(jsonb)', 'fz.', '.noop');
my @WEIRD_TASK = (
	"\x{3A9}", "\x{1F600}", 'a b ', 'q"', "apos'", 'back\\', "tab\t", "\x01",
	'end', 'END_', '-', '1-2-3-', '#', 'x' x 58, "\x{202E}", "e\x{301}",
	'%s%n', "new\nline", '$1', '{}', 'END ', 'onErr');
my @PRED_OK = (
	'$.hops < 3', '$.hops < 5', '$.hops > 1', '$.hops >= 2 && $.hops < 4',
	'$.x > 3', '$.x == 1', '$.x < 50', 'exists($.tags)', '!exists($.nope)',
	'$.flag == true', '$.total > 10', '$.s starts with "a"', '$.s like_regex "^a+"',
	'$.items.size() > 2', '$.x.type() == "number"', 'true', 'false',
	'$.items[*] > 50', '$.hops % 2 == 0', '$.x / 0 == 1', 'strict $.nope == 1',
	'$.x.double() > 1', '$.x', '$.**.a > 1');
my @PRED_RISKY = (
	'$.d.datetime() < "2020-01-01 00:00:00+00".datetime()',
	'$.s.datetime() > "2020-01-01".datetime()', '$.x == $var',
	'$.d.datetime("YYYY") > "2019".datetime("YYYY")',
	'$.x.keyvalue().size() > 0', '$.items[1000000000] == 1',
	'$.big like_regex "(x+x+)+y"');
my @PRED_BAD = (
	'$.a ===', '', '$$', '@ > 1', 'not a path (', 'last > 0',
	'$.x like_regex "a" flag "z"', '$.', '$[', "\$.\x{1F600} > 1",
	('(' x 5000) . '$.a' . (')' x 5000), '$.a' . (' || $.a == 1' x 20000),
	'$.a ? (@ == 1', '$.a.nonsense()', "\$.a == \"\\ud800\"", '$.x like_regex "("');

sub pred
{
	my ($valid) = @_;
	return wpick(
		sub { pick(@PRED_OK) } => 85,
		sub { pick(@PRED_RISKY) } => 10,
		sub { pick(@PRED_BAD) } => ($valid ? ($valid eq 'strict' ? 0 : 1) : 10))->();
}

my %REDUCER = (
	total => 'add', log => 'append', tags => 'union', m => 'merge', lo => 'min',
	hi => 'max', ok => 'and', any => 'or', s => 'concat', r => 'replace');

sub task_names
{
	my ($n, $weird) = @_;
	my (@names, %seen);
	for my $i (0 .. $n - 1)
	{
		my $name = "T$i";
		if ($weird && chance(0.4))
		{
			my $w = pick(@WEIRD_TASK) . $i;
			$name = $w unless length(encode_utf8($w)) > 63 || $seen{$w};
		}
		$seen{$name} = 1;
		push @names, $name;
	}
	return @names;
}

# A random graph, valid when $o{valid} (mostly: a few bad paths slip in).
# Returns {def, names, gotos, fns}.
sub gen_graph
{
	my (%o) = @_;
	my $n = $o{n} // (1 + rint(chance(0.5) ? 6 : 12));
	my @names = task_names($n, $o{weird} // chance(0.15));
	my @fn = map { wpick(@TASK_FNS) } 1 .. $n;
	my (@edges, %mode, %gotos);

	my $add = sub {
		my ($from, $to, $kind) = @_;
		my %e = (from => $from, to => $to, kind => $kind);
		# A task's edges are all switch edges, or none are (goto and
		# on_error edges aside).
		if ($kind ne 'goto' && $kind ne 'on_error')
		{
			my $m = $mode{$from} //= ($kind eq 'switch' ? 'switch' : 'normal');
			if ($m eq 'switch')
			{
				$e{kind} = 'switch';
				$e{to} = $to->[0] if ref $to;
			}
			elsif ($kind eq 'switch') { $e{kind} = 'when'; }
		}
		$e{pred} = pred($o{valid}) if $e{kind} eq 'when' || $e{kind} eq 'switch';
		if ($e{kind} eq 'for_each')
		{
			$e{field} = wpick(items => 6, tags => 2, x => 1, nope => 1, big => 1);
			$e{as} = pick('it', 'item', 'x', 'hops', '', "\x{3A9}", 'itemIndex')
			  if chance(0.4);
		}
		push @edges, \%e;
	};

	# A tree from T0: every task is reachable.  Plain edges only go forward,
	# so no cycle is unconditional.
	for my $i (1 .. $n - 1)
	{
		my $j = chance(0.6) ? $i - 1 : rint($i);
		my $kind = wpick(plain => 50, when => 15, switch => 6, for_each => 10, fanout => 8);
		if ($kind eq 'fanout')
		{
			my @t = ($i);
			push @t, $i + 1 + rint($n - $i) for 1 .. 1 + rint(2);
			@t = map { $_ >= $n ? -1 : $_ } @t;
			push @t, $i if chance(0.1);
			$add->($j, \@t, 'fanout');
		}
		else { $add->($j, $i, $kind); }
	}
	# Loops back: through conditions, goto or on_error.
	for (1 .. rint(3))
	{
		my $a = rint($n);
		my $b = rint($a + 1);
		my $kind = wpick(when => 4, goto => 3, on_error => 1, switch => 1);
		$add->($a, $b, $kind);
		if ($kind eq 'goto')
		{
			$gotos{ $names[$a] } = $names[$b];
			$fn[$a] = 'fz.goto' if chance(0.8);
		}
		$fn[$a] = pick('fz.raise', 'fz.nonobj', 'fz.exec')
		  if $kind eq 'on_error' && chance(0.5);
	}
	# More edges forward, and to END.
	for (1 .. rint(3))
	{
		my $a = rint($n);
		my $b = chance(0.3) ? -1 : $a + 1 + rint($n - $a);
		$b = -1 if $b >= $n;
		my $kind = wpick(plain => 3, when => 3, on_error => 2, goto => 1, for_each => 1);
		next if $kind eq 'goto' && $b < 0;
		$add->($a, $b, $kind);
		$gotos{ $names[$a] } = $names[$b] if $kind eq 'goto';
		$fn[$a] = pick('fz.raise', 'fz.nonobj') if $kind eq 'on_error' && chance(0.5);
	}

	my %incoming;
	for my $e (@edges)
	{
		next if $e->{kind} eq 'goto' || $e->{kind} eq 'on_error';
		$incoming{$_}++ for grep { $_ >= 0 } (ref $e->{to} ? @{ $e->{to} } : $e->{to});
	}
	my @fan_in = map { $names[$_] }
	  grep { (($incoming{$_} // 0) >= 2 && chance(0.6)) || chance(0.05) } 0 .. $n - 1;

	my $nm = sub { $_[0] < 0 ? 'END' : $names[ $_[0] ] };
	my @trans;
	for my $e (@edges)
	{
		my $to = ref $e->{to} ? [ map { $nm->($_) } @{ $e->{to} } ] : $nm->($e->{to});
		if ($e->{kind} eq 'plain' && !ref $to && chance(0.2))
		{
			push @trans, O(chain => [ $names[ $e->{from} ], $to ]);
			next;
		}
		my $t = O(from => $names[ $e->{from} ], to => $to);
		oset($t, when => $e->{pred})     if $e->{kind} eq 'when';
		oset($t, switch => $e->{pred})   if $e->{kind} eq 'switch';
		oset($t, goto => R('true'))      if $e->{kind} eq 'goto';
		oset($t, on_error => R('true'))  if $e->{kind} eq 'on_error';
		oset($t, goto => R('false'))     if $e->{kind} eq 'plain' && chance(0.05);
		oset($t, on_error => R('false')) if $e->{kind} eq 'fanout' && chance(0.05);
		if ($e->{kind} eq 'for_each')
		{
			oset($t, for_each => $e->{field});
			oset($t, as => $e->{as}) if defined $e->{as};
		}
		push @trans, $t;
	}

	my $def = O(tasks => O(map { ($names[$_], $fn[$_]) } 0 .. $n - 1));
	oset($def, transitions => \@trans) if @trans || chance(0.5);
	oset($def, fan_in => \@fan_in) if @fan_in;
	if (chance(0.6))
	{
		oset($def, reducers =>
			  O(map { ($_, $REDUCER{$_}) } grep { chance(0.4) } sort keys %REDUCER));
	}
	oset($def, entry => $names[0]) if chance(0.8) || ($o{valid} // '') eq 'strict';
	@$def = map { @$_ } shuffle(map { [ $def->[ 2 * $_ ], $def->[ 2 * $_ + 1 ] ] } 0 .. $#$def / 2)
	  if chance(0.3);
	return { def => $def, names => \@names, gotos => \%gotos, fns => \@fn };
}

# One mutation of a rendered definition, most of them fatal to it.
sub mutate
{
	my ($def) = @_;
	my $tasks = oget_ref($def, 'tasks');
	my @tn = $tasks ? okeys($tasks) : ('T0');
	my $t0 = pick(@tn, 'T0', 'T1', 'Nowhere');
	my $t1 = pick(@tn, 'T1', 'END');
	my $trans = oget_ref($def, 'transitions');
	my $push_trans = sub {
		$trans = [] unless ref $trans eq 'ARRAY';
		push @$trans, @_;
		oset($def, transitions => $trans);
	};
	my $m = rint(20);
	if ($m == 0) { odel($def, 'tasks'); }
	elsif ($m == 1)
	{
		oset($def, tasks => pick([], 'str', R(42), undef, O(), deep_array(5000), [ O(T0 => 'fz.noop') ]));
	}
	elsif ($m == 2 && $tasks) { oset($tasks, pick(@tn), pick(@BAD_FNS)); }
	elsif ($m == 3 && $tasks)
	{
		oset($tasks, pick('', 'END', 'x' x 64, "\x{1F600}" x 16, "\x{3A9}" x 32, ' ' x 64), 'fz.noop');
	}
	elsif ($m == 4) { oset($def, pick('edges', 'Tasks', 'entry ', 'fanin', 'reducer', wstr()), R(1)); }
	elsif ($m == 5 || $m == 6 || $m == 7)
	{
		$push_trans->(
			pick(
				R(1), 'str', undef, [], O(), O(from => $t0), O(to => $t0),
				O(from => R(1), to => $t0), O(from => $t0, to => O()), O(from => $t0, to => []),
				O(from => $t0, to => [R(1)]), O(from => 'END', to => $t0),
				O(from => $t0, to => 'Nowhere'), O(from => $t0, to => $t1, weight => R(2)),
				O(from => $t0, to => $t1, when => '$.a == 1', goto => R('true')),
				O(from => $t0, to => $t1, as => 'x'), O(from => $t0, to => 'END', goto => R('true')),
				O(from => $t0, to => $t1, goto => 'yes'), O(from => $t0, to => $t1, on_error => R(1)),
				O(chain => [ $t0, 'END', $t1 ]), O(chain => [R(1)]), O(chain => $t0),
				O(chain => [$t0], from => $t0), O(chain => []), O(chain => ['END']),
				O(from => $t0, to => [ $t1, $t1, 'END' ]),
				O(from => $t0, to => [ $t1, $t0 ], switch => 'true'),
				O(from => $t0, to => [ $t1, $t0 ], for_each => 'items'),
				O(from => $t0, to => $t1, when => R(1)), O(from => $t0, to => $t1, for_each => R(1)),
				O(from => $t0, to => $t1, for_each => 'items', as => R(1)),
				O(from => $t0, to => $t0), O(from => $t1, to => $t0),
				O(from => $t0, to => $t1, when => pick(@PRED_BAD)),
				O(from => $t0, to => $t1, switch => '$.x', when => '$.y'),
				O(from => $t0, to => $t1, on_error => R('true'), goto => R('true')),
				O(from => $t0, to => $t1, goto => R('null')), O(from => undef, to => undef),
				O(from => $t0, to => $t1, to => $t0), O(from => $t0, to => deep_array(3000)),
				O(from => $t0, to => [ map { $t1 } 1 .. 2000 ]),
				O(from => $t0, to => $t1, for_each => 'items', as => 'x' x 1000)));
	}
	elsif ($m == 8) { oset($def, transitions => pick(O(), 'str', R(1), undef, deep_array(4000))); }
	elsif ($m == 9)
	{
		oset($def, fan_in => pick($t0, [R(1)], ['END'], ['Nowhere'], O(), [undef], [ $t0, $t0 ], [[$t0]]));
	}
	elsif ($m == 10)
	{
		oset($def, reducers => pick(
				[], 'add', O(total => 'sum'), O(total => R(1)), O('' => 'add'), O(x => undef),
				O(x => 'ADD'), O(map { ("f$_" => 'add') } 1 .. 1000), O(total => ['add']),
				O("\x{1F600}" => 'union')));
	}
	elsif ($m == 11) { oset($def, entry => pick('END', 'Nowhere', R(1), undef, '', [], $t1)); }
	elsif ($m == 12 && $tasks) { oset($tasks, pick(@tn), 'x' x 1000000); }
	elsif ($m == 13) { oset($def, pick('tasks', 'transitions', 'fan_in', 'reducers', 'entry'), deep_object(3000)); }
	elsif ($m == 14 && $tasks) { oset($tasks, 'Orphan', 'fz.noop'); }
	elsif ($m == 15)
	{
		$push_trans->(O(from => $t0, to => $t1, switch => '$.x > 1'), O(from => $t0, to => $t1));
	}
	elsif ($m == 16) { $push_trans->(O(chain => [ @tn, $tn[0] ])); }
	elsif ($m == 17) { push @$def, 'tasks', O(A => 'fz.noop'); }
	elsif ($m == 18 && $tasks) { oset($tasks, pick(@tn), pick(@BAD_FNS)); }
	else { $push_trans->(O(from => $t0, to => $t1, when => pick(@PRED_BAD, @PRED_RISKY))); }
	return $def;
}

sub oget_ref
{
	my ($o, $k) = @_;
	my $v;
	for (my $i = 0; $i < @$o; $i += 2) { $v = $o->[ $i + 1 ] if $o->[$i] eq $k; }
	return (ref $v eq 'FzObj' || ref $v eq 'ARRAY') ? $v : undef;
}

# A definition as a jsonb SQL expression: valid-ish, or mutated, or not even
# an object (or not JSON).
sub def_sql
{
	my ($g, $junk) = @_;
	return lit(pick(@BAD_JSON)) . '::jsonb' if $junk && chance(0.05);
	return jlit(pick([], 'str', R(42), undef, R('true'), deep_array(10000), deep_array(200000)))
	  if $junk && chance(0.05);
	my $def = $g->{def};
	if ($junk) { $def = mutate($def) for 1 .. 1 + rint(2); }
	return chance(0.03) ? 'NULL' : jlit($def);
}

# Big graphs, built in SQL: up to 12,000 tasks, or 100,000 targets.
sub big_graph_sql
{
	my $n = pick(10000, 10001, 12000, 5000, 9999, 2000, 100000);
	my $tasks = "(SELECT jsonb_object_agg('t' || g, 'fz.noop') FROM generate_series(1, $n) g)";
	my $chain = "(SELECT jsonb_agg('t' || g ORDER BY g) FROM generate_series(1, $n) g)";
	my $trans = pick(
		"jsonb_build_array(jsonb_build_object('chain', $chain))",
		"jsonb_build_array(jsonb_build_object('from', 't1', 'to', (SELECT jsonb_agg('t' || g) FROM generate_series(2, $n) g)))",
		"(SELECT jsonb_agg(jsonb_build_object('from', 't' || ((g * 7919) % (g - 1) + 1), 'to', 't' || g)) FROM generate_series(2, $n) g)",
		"(SELECT jsonb_agg(jsonb_build_object('from', 't' || (g - 1), 'to', 't' || g, 'when', '\$.hops < 1')) FROM generate_series(2, $n) g)",
		"jsonb_build_array(jsonb_build_object('chain', $chain), jsonb_build_object('from', 't$n', 'to', 't1'))",
		"jsonb_build_array(jsonb_build_object('chain', $chain), jsonb_build_object('from', 't$n', 'to', 't1', 'goto', true))",
		"jsonb_build_array(jsonb_build_object('from', 't1', 'to', (SELECT jsonb_agg('t2'::text) FROM generate_series(1, 100000))), jsonb_build_object('chain', $chain))",
		"(SELECT jsonb_agg(jsonb_build_object('from', 't' || g, 'to', 't' || (g + 1), 'on_error', true)) FROM generate_series(1, $n - 1) g) || jsonb_build_array(jsonb_build_object('chain', $chain))",
		"'[]'::jsonb");
	my $extra = pick(
		'', ", 'fan_in', jsonb_build_array('t$n')",
		", 'fan_in', (SELECT jsonb_agg('t' || g) FROM generate_series(1, $n) g)",
		", 'reducers', (SELECT jsonb_object_agg('f' || g, 'add') FROM generate_series(1, $n) g)",
		", 'entry', 't1'");
	my $def = "jsonb_build_object('tasks', $tasks, 'transitions', $trans$extra)";
	return chance(0.5)
	  ? "SELECT dwarf.validate($def) IS NOT NULL"
	  : "SELECT dwarf.define('fz_big_" . rint(5) . "', $def)";
}

# ================================================================ flows

my @TASK_SQL = (
	'SELECT 1/0', 'CREATE TEMP TABLE fz_tmp (x int)', 'SET ROLE fz_user', 'LISTEN fz_chan',
	'PREPARE fz_p AS SELECT 1', 'DISCARD ALL', 'SET search_path = fz',
	"SELECT set_config('work_mem', '64kB', false)",
	"SELECT set_config('statement_timeout', '1', false)",
	"SELECT set_config('default_transaction_read_only', 'on', false)",
	'SELECT pg_advisory_lock(42)', 'SELECT pg_advisory_xact_lock(43)',
	"SELECT dwarf.run('fz_leaf', '{}')", "SELECT dwarf.await(dwarf.flow_id(), '1 s')",
	"SELECT dwarf.await(dwarf.flow_id(), '0')", "SELECT dwarf.cancel(dwarf.flow_id(), 'self')",
	'SELECT dwarf.delete(dwarf.flow_id())', "SELECT dwarf.resume(dwarf.flow_id(), '1')",
	"SELECT dwarf.create('fz_leaf', '{}')", "SELECT dwarf.continue(dwarf.flow_id(), '{}')",
	"SELECT dwarf.fork((SELECT max(step_id) FROM dwarf.step WHERE flow_id = dwarf.flow_id()), '{}')",
	"SELECT dwarf.define('fz_in_task', '{\"tasks\": {\"A\": \"fz.noop\"}}')",
	'SELECT * FROM dwarf.history(dwarf.flow_id())', 'SELECT * FROM dwarf.snapshot(dwarf.flow_id())',
	'SELECT dwarf.history_mermaid(dwarf.flow_id())',
	'SELECT dwarf.step_key(), dwarf.baggage(), dwarf.flow_id()',
	"SELECT dwarf.goto('T1')", "SELECT dwarf.goto('END')",
	"SELECT dwarf.interrupt('{\"from\": \"exec\"}')", "SELECT dwarf.subgraph('fz_leaf', '{}')",
	"SELECT dwarf.sleep('-1 s')", "SELECT dwarf.retry('1 ms', 1, '1 ms')",
	"SELECT dwarf.purge('100 years')", 'SELECT * FROM dwarf.stats', 'SELECT pg_sleep(0.3)',
	'COMMIT', 'ROLLBACK', 'SAVEPOINT fz_sp', 'SELECT pg_cancel_backend(pg_backend_pid())',
	'UPDATE fz.counter SET n = n + 1', 'LOCK TABLE fz.counter IN ACCESS EXCLUSIVE MODE',
	"SELECT repeat('x', 1073741824)", 'SELECT txid_current()',
	"DO \$x\$BEGIN RAISE EXCEPTION 'nested' USING ERRCODE = '40001'; END\$x\$",
	"SELECT dwarf.cancel(id) FROM dwarf.flow WHERE status = 'running' AND id <> dwarf.flow_id() ORDER BY id DESC LIMIT 1",
	'SELECT dwarf.delete(id) FROM dwarf.flow WHERE parent_id = dwarf.flow_id()',
	"SELECT dwarf.resume(id) FROM dwarf.flow WHERE status = 'interrupted' ORDER BY id DESC LIMIT 1",
	'NOTIFY fz_chan', "SELECT pg_notify('fz', 'x')", 'VACUUM fz.counter',
	'CREATE TABLE IF NOT EXISTS fz.made_in_task (x int)',
	'SELECT count(*) FROM generate_series(1, 2000000)',
	"SELECT dwarf.validate(jsonb_build_object('tasks', jsonb_build_object('A', 'fz.noop')))");

my @POOL;        # [name, graph]: valid graphs defined at the start
my %POOL_GRAPH;

sub pick_graph
{
	return ('fz_bigchain', undef) if chance(0.003);
	return ('fz_bigfan',   undef) if chance(0.003);
	return (pick('fz_nope', '', 'fz_tx1', "\x{3A9}", 'x' x 64, 'fz_r' . rint(3000), undef), undef)
	  if chance(0.05);
	my $p = pick(@POOL);
	return ($p->[0], $p->[1]);
}

sub gen_ret
{
	return pick([], 'str', R(1), R('null'), deep_array(50000)) if chance(0.1);
	my $o = O();
	oset($o, total => pick(R(pick(@NUMS)), 'str', [], R(1))) if chance(0.4);
	oset($o, log => rjson()) if chance(0.3);
	oset($o, tags => pick([ map { rjson(2) } 1 .. rint(4) ], 'str', R(1), [ map { R($_) } 1 .. 2000 ])) if chance(0.3);
	oset($o, m => pick(O(a => R(1)), [], R(1), deep_object(2000))) if chance(0.2);
	oset($o, lo => pick(R(pick(@NUMS)), 'str', R('true'))) if chance(0.2);
	oset($o, hi => pick(R(pick(@NUMS)), 'str', [])) if chance(0.2);
	oset($o, ok => pick(R('true'), R('false'), R(1))) if chance(0.2);
	oset($o, any => pick(R('true'), R('false'), 'yes')) if chance(0.2);
	oset($o, s => pick('str', [R(1)], R(1), 'x' x 10000)) if chance(0.2);
	oset($o, r => rjson()) if chance(0.2);
	oset($o, pick(@WEIRD), rjson()) if chance(0.3);
	oset($o, pick('hops', 'items', 'onErr', 'x', 'tries'), pick(undef, 'str', R('1e300'), R(-5))) if chance(0.2);
	return $o;
}

# A flow's input: every task function reads its own keys from the state.
sub gen_input
{
	my ($g, $fid, $depth) = @_;
	$depth //= 0;
	my %has = map { $_ => 1 } @{ $g ? $g->{fns} : [] };
	my $o = O(fz => R($fid));
	oset($o, hops => pick(R(0), R(-1), R('1e300'), 'str', R(3))) if chance(0.05);
	oset($o, x => chance(0.9) ? R(rint(10)) : pick('str', undef, R('1e300'))) if chance(0.6);
	oset($o, items => chance(0.9)
		? [ map { R(rint(100)) } 1 .. rint(6) ]
		: pick('str', O(a => R(1)), undef, [ map { R($_) } 1 .. 120 ])) if chance(0.6);
	oset($o, tags => [ map { pick('a', 'b', 'c', R(1)) } 1 .. rint(4) ]) if chance(0.3);
	oset($o, flag => R(pick('true', 'false'))) if chance(0.2);
	oset($o, s => pick('aaa', 'b', '', "\x{3A9}")) if chance(0.2);
	oset($o, d => pick('2019-05-05', '2021-01-01 10:00:00+02', 'not a date', R(1))) if chance(0.1);
	if ($has{'fz.sleeper'} || chance(0.03))
	{
		if (chance(0.04))
		{
			# sleeps that add up past what a timestamp holds
			oset($o, nap => pick('36525 days', '100 years'));
			oset($o, naps => R(pick(2500, 2922, 2923, 3000, 5000)));
		}
		else
		{
			oset($o, nap => wpick(
					'1 ms' => 40, '0' => 3, '10 ms' => 5, '1 hour' => 3, '100 years' => 1,
					'36525 days' => 1, '36525 days 1 us' => 1, '-1 s' => 2, '106751990 days' => 1,
					'junk' => 1, '1 mon -40 days' => 1, '2147483647 days 2562047788 hours' => 1,
					'00:00:00.000001' => 1)) if chance(0.8);
			oset($o, naps => wpick(R(1) => 40, R(2) => 5, R(0) => 3, R(-1) => 1, R(300) => 1, 'x' => 1))
			  if chance(0.3);
		}
	}
	if ($g && %{ $g->{gotos} } && chance(0.9))
	{
		oset($o, gotos => O(map { ($_, $g->{gotos}{$_}) } sort keys %{ $g->{gotos} }));
	}
	oset($o, goto => pick(@WEIRD, 'T1', 'T0')) if chance(0.05);
	if ($has{'fz.raise'} || chance(0.03))
	{
		oset($o, msg => wpick('boom' => 10, wstr() => 3, 'x' x 100000 => 1, '' => 1)) if chance(0.7);
		oset($o, code => wpick(
				'P0001' => 3, '22012' => 1, '40001' => 2, '40P01' => 2, '55P03' => 2, '57014' => 2,
				'XX000' => 1, 'ZZZZZ' => 1, '00000' => 1, 'abcde' => 1, '23505' => 1)) if chance(0.6);
		oset($o, detail => wstr()) if chance(0.2);
	}
	oset($o, nonobj => pick('array', 'string', 'number', 'null', 'true', 'nested'))
	  if $has{'fz.nonobj'} && chance(0.8);
	oset($o, payload => rjson()) if ($has{'fz.intr'} || $has{'dwarf.interrupt'}) && chance(0.7);
	oset($o, intr_twice => R('true')) if $has{'fz.intr'} && chance(0.2);
	if ($has{'fz.sub'} || chance(0.03))
	{
		oset($o, sub => chance(0.85) ? pick((map { $_->[0] } @POOL), 'fz_leaf') : pick('fz_nope', '', wstr()))
		  if chance(0.9);
		if (chance(0.6))
		{
			my $child = $depth < 2 && chance(0.5) ? gen_input(pick(@POOL)->[1], $fid, $depth + 1) : O();
			oset($o, subin => chance(0.9) ? $child : pick([], 'str', undef, R(1)));
		}
	}
	if ($has{'fz.odd'} || chance(0.03))
	{
		my $kind = wpick(
			ret => 10, big => 1, wide => 1, deep => 2, deepobj => 1, nulls => 2, self => 1,
			numbers => 2, unicode => 2, other => 1);
		oset($o, odd => $kind);
		oset($o, ret => gen_ret()) if $kind eq 'ret' && chance(0.9);
		oset($o, size => R(
				$kind eq 'big'   ? pick(1000, 100000, 1000000, 4000000) :
				$kind eq 'wide'  ? pick(100, 10000, 50000) :
				$kind =~ /^deep/ ? pick(100, 1000, 5000, 50000, 200000) : pick(-1, 0, 10)))
		  if chance(0.9);
	}
	oset($o, sql => pick(@TASK_SQL)) if ($has{'fz.exec'} && chance(0.9)) || chance(0.02);
	if ($has{'fz.retry'} || chance(0.03))
	{
		oset($o, r_init   => pick('1 ms', '1 ms', '10 ms', '-1 s', '101 years', '0', 'junk', '1 hour')) if chance(0.5);
		oset($o, r_factor => pick('2', '1', '0.5', '0', '-2', 'NaN', 'Infinity', '-Infinity', '1e308', 'x')) if chance(0.4);
		oset($o, r_max    => pick('10 ms', '1 ms', '-1 min', '100 years', '2147483647 days', '0')) if chance(0.4);
		oset($o, r_give   => pick('1 ms', '0', '-1 h', '1 hour', '200 years', 'junk')) if chance(0.3);
		oset($o, max_tries => R(pick(0, 1, 2, 3, 20, -1))) if chance(0.3);
		oset($o, r_twice => R('true')) if chance(0.1);
	}
	oset($o, snooze => R(pick('0.3', '0.01', '0'))) if $has{'fz.snooze'};
	oset($o, pick(@WEIRD), rjson()) if chance(0.1);
	return $o;
}

sub gen_opts
{
	my @o;
	push @o, 'priority => ' . pick('0', '1', '-1', '2147483647', '-2147483648', 'NULL', '5') if chance(0.3);
	push @o, 'idempotency_key => '
	  . lit(wpick('k1' => 3, 'k2' => 3, '' => 1, "\x{1F600}" => 1, wstr() => 2,
			rand_text(3000 + rint(6000)) => 1, (undef, 1)))
	  if chance(0.2);
	push @o, 'fairness_key => ' . lit(pick('tenant-a', 'tenant-b', '', wstr(), undef)) if chance(0.15);
	push @o, 'fairness_weight => ' . pick('1', '0', '-1', '10000', '10001', '2147483647', 'NULL', '3')
	  if chance(0.15);
	push @o, 'time_budget => ' . ival() if chance(0.15);
	push @o, 'delete_on_completion => ' . pick('true', 'false', 'NULL') if chance(0.15);
	push @o, 'baggage => ' . (chance(0.1) ? 'NULL' : jlit(rjson())) if chance(0.15);
	push @o, 'thread => ' . lit(wpick('th1' => 3, '' => 1, wstr() => 2, rand_text(4000) => 1, (undef, 1)))
	  if chance(0.1);
	return shuffle(@o);
}

sub run_timeout
{
	return wpick(
		"'0'" => 5, "'1 ms'" => 3, "'10 ms'" => 5, "'50 ms'" => 5, "'200 ms'" => 3, "'1 s'" => 1,
		'NULL' => 1, "'-1 s'" => 1, "'2147483647 days 2562047788 hours'" => 1, "'101 years'" => 1,
		"'36525 days'" => 0.2, "'infinity'" => 0.3, "'-0.5 ms'" => 0.3);
}

sub flow_id_expr
{
	my ($status) = @_;
	my $k = rint(30);
	return wpick(
		"(SELECT id FROM dwarf.flow ORDER BY id DESC OFFSET $k LIMIT 1)" => 35,
		"(SELECT id FROM dwarf.flow WHERE status = '"
		  . ($status // pick('running', 'interrupted', 'completed', 'failed', 'cancelled'))
		  . "' ORDER BY id DESC OFFSET " . rint(10) . ' LIMIT 1)' => 25,
		'(SELECT id FROM dwarf.flow WHERE parent_id IS NOT NULL ORDER BY id DESC OFFSET ' . rint(5) . ' LIMIT 1)' => 5,
		'(SELECT parent_id FROM dwarf.flow WHERE parent_id IS NOT NULL ORDER BY id DESC OFFSET ' . rint(5) . ' LIMIT 1)' => 5,
		pick('NULL', '0', '-1', '1', '9223372036854775807', '-9223372036854775808', '281474976710656',
			'4242424242') => 20,
		pick("'abc'", '1.5', "'9223372036854775808'") => 2);
}

sub step_id_expr
{
	return wpick(
		'(SELECT step_id FROM dwarf.step ORDER BY step_id DESC OFFSET ' . rint(100) . ' LIMIT 1)' => 6,
		"(SELECT step_id FROM dwarf.step WHERE status = '"
		  . pick('completed', 'failed', 'retry', 'interrupted', 'waiting', 'resumed')
		  . "' ORDER BY step_id DESC OFFSET " . rint(10) . ' LIMIT 1)' => 3,
		pick('NULL', '0', '-1', '9223372036854775807', '-9223372036854775808') => 2);
}

sub task_name_lit
{
	my $p = pick(@POOL);
	return lit(chance(0.8) ? pick(@{ $p->[1]{names} }) : pick(@WEIRD, undef));
}

# ================================================================ inputs

# Each generator returns [kind, as_fz_user, sql].
my %GEN;
$GEN{define} = sub {
	my ($id) = @_;
	my $junk = chance(0.5);
	my $g = gen_graph(n => (chance(0.2) ? rint(51) : undef), valid => !$junk);
	my $name = wpick(
		sub { pick(@POOL)->[0] } => 3, sub { "fz_r$id" } => 6,
		sub { pick('', 'has space', 'semi;colon', 'x' x 64, 'x' x 63, "\x{3A9}" x 32, "\x{1F600}", 'END', undef,
				'a' x 1000, '-', '.', ' lead', 'trail ', "tab\tname", "\x01", "new\nline", "\x{7f}") } => 1)->();
	return [ 'define', chance(0.1), 'SELECT dwarf.define(' . lit($name) . ', ' . def_sql($g, $junk) . ')' ];
};
$GEN{validate} = sub {
	my $junk = chance(0.6);
	my $g = gen_graph(n => (chance(0.3) ? rint(51) : undef), valid => !$junk);
	return [ 'validate', chance(0.1), 'SELECT dwarf.validate(' . def_sql($g, $junk) . ')' ];
};
$GEN{big} = sub { return [ 'big', 0, big_graph_sql() ]; };
$GEN{create} = sub {
	my ($id) = @_;
	my ($gname, $g) = pick_graph();
	my $input = chance(0.94)
	  ? jlit(gen_input($g, $id))
	  : pick('NULL', "'[]'::jsonb", "'1'::jsonb", "'null'::jsonb", "'\"s\"'::jsonb",
		lit(pick(@BAD_JSON)) . '::jsonb');
	return [ 'create', chance(0.12),
		'SELECT dwarf.create(' . join(', ', lit($gname), $input, gen_opts()) . ')' ];
};
$GEN{run} = sub {
	my ($id) = @_;
	my ($gname, $g) = pick_graph();
	my $input = chance(0.95) ? jlit(gen_input($g, $id)) : pick('NULL', "'[]'::jsonb", "'7'::jsonb");
	my @args = (lit($gname), $input);
	push @args, 'timeout => ' . run_timeout() if chance(0.97);
	return [ 'run', chance(0.12), 'SELECT * FROM dwarf.run(' . join(', ', @args, gen_opts()) . ')' ];
};
$GEN{await} = sub {
	my $t = chance(0.97) ? ', ' . run_timeout() : '';
	return [ 'await', chance(0.12), 'SELECT * FROM dwarf.await(' . flow_id_expr() . "$t)" ];
};
$GEN{cancel} = sub {
	my $reason = chance(0.5) ? ', ' . lit(pick(wstr(), 'enough', undef)) : '';
	return [ 'cancel', chance(0.12), 'SELECT dwarf.cancel(' . flow_id_expr(pick('running', 'interrupted')) . "$reason)" ];
};
$GEN{resume} = sub {
	my $data = chance(0.8) ? ', ' . (chance(0.1) ? 'NULL' : jlit(rjson())) : '';
	return [ 'resume', chance(0.12),
		'SELECT dwarf.resume(' . flow_id_expr(chance(0.8) ? 'interrupted' : undef) . "$data)" ];
};
$GEN{fork} = sub {
	my $ov = chance(0.8) ? ', ' . (chance(0.8) ? jlit(gen_ret()) : pick('NULL', "'[]'::jsonb")) : '';
	return [ 'fork', chance(0.12), 'SELECT dwarf.fork(' . step_id_expr() . "$ov)" ];
};
$GEN{continue} = sub {
	my $in = chance(0.8) ? ', ' . (chance(0.85) ? jlit(gen_ret()) : pick('NULL', "'1'::jsonb")) : '';
	return [ 'continue', chance(0.12),
		'SELECT dwarf.continue(' . flow_id_expr(pick('completed', 'failed', 'cancelled', 'running')) . "$in)" ];
};
$GEN{delete} = sub {
	return [ 'delete', chance(0.12), 'SELECT dwarf.delete(' . flow_id_expr() . ')' ];
};
$GEN{purge} = sub {
	my $iv = wpick(sub { lit(pick('30 days', '1 hour', '100 years', '101 years', '-1 s',
					'2147483647 days 2562047788 hours', '1 mon -40 days', '0')) . '::interval' } => 1,
		sub { 'NULL' } => 0.2)->();
	return [ 'purge', chance(0.2), "SELECT dwarf.purge($iv)" ];
};
$GEN{read} = sub {
	my $id = flow_id_expr();
	my $sql = wpick(
		"SELECT * FROM dwarf.snapshot($id)" => 3,
		"SELECT * FROM dwarf.history($id)" => 3,
		"SELECT * FROM dwarf.history($id) WHERE task = " . task_name_lit() => 2,
		"SELECT dwarf.history_mermaid($id)" => 3,
		"SELECT dwarf.state_at($id, " . (chance(0.5) ? step_id_expr() : 'NULL') . ')' => 2,
		"SELECT dwarf.replay_state($id" . (chance(0.7) ? ', ' . step_id_expr() : '') . ')' => 2,
		'SELECT * FROM dwarf.stats' => 1,
		'SELECT * FROM dwarf.worker_stats()' => 1,
		'SELECT * FROM dwarf.list(' . join(', ', shuffle(grep { defined } (
				chance(0.4) ? 'graph => ' . lit(chance(0.7) ? pick(@POOL)->[0] : wstr()) : undef,
				chance(0.4) ? 'status => ' . lit(pick('running', 'completed', 'failed', 'bogus', undef)) : undef,
				chance(0.2) ? 'since => ' . pick("now() - interval '1 hour'", "'infinity'", "'-infinity'", "'epoch'", 'NULL', "'garbage'") : undef,
				chance(0.2) ? 'until => ' . pick("now()", "'infinity'", "'-infinity'", 'NULL') : undef,
				chance(0.2) ? 'thread => ' . lit(pick('th1', wstr())) : undef,
				chance(0.3) ? 'error_like => ' . lit(pick('%', '%boom%', '\\', 'a\\', '%%%%', wstr())) : undef,
				chance(0.3) ? "before => $id" : undef,
				chance(0.4) ? 'page_size => ' . pick('0', '-1', '1', 'NULL', '2147483647', '100') : undef))) . ')' => 4);
	return [ 'read', chance(0.15), $sql ];
};
$GEN{outside} = sub {
	my $sql = pick(
		'SELECT dwarf.goto(' . lit(pick(wstr(), undef)) . ')',
		'SELECT dwarf.retry(' . join(', ', ival(), pick('2', '1', '0', 'NULL', "'NaN'"), ival(), ival()) . ')',
		'SELECT dwarf.retry()',
		'SELECT dwarf.sleep(' . ival() . ')',
		'SELECT dwarf.interrupt(' . (chance(0.2) ? '' : jlit(rjson())) . ')',
		'SELECT dwarf.subgraph(' . lit(pick('fz_leaf', wstr(), undef)) . ', ' . jlit(rjson()) . ')',
		'SELECT dwarf.step_key()', 'SELECT dwarf.flow_id()', 'SELECT dwarf.baggage()');
	return [ 'outside', chance(0.1), $sql ];
};
$GEN{fold} = sub {
	my $input = pick(sub { jlit(gen_ret()) }, sub { jlit(rjson()) }, sub { 'NULL' })->();
	my $changes = pick(
		sub { 'NULL' }, sub { "'{}'::jsonb[]" }, sub { 'ARRAY[NULL::jsonb]' },
		sub { 'ARRAY[' . join(', ', map { jlit(chance(0.8) ? gen_ret() : rjson()) } 1 .. 1 + rint(5)) . ']::jsonb[]' },
		sub { 'ARRAY[[' . jlit(gen_ret()) . ', ' . jlit(gen_ret()) . '], [' . jlit(gen_ret()) . ", NULL]]::jsonb[]" },
		sub { "array_fill('{\"total\": 1, \"log\": [1]}'::jsonb, ARRAY[" . pick(10, 100, 1000) . '])' },
		sub { "'[1:2]={\"{\\\"a\\\": 1}\",\"{}\"}'::jsonb[]" })->();
	my $red = pick(
		sub { 'NULL' },
		sub { jlit(O(map { ($_, $REDUCER{$_}) } grep { chance(0.5) } sort keys %REDUCER)) },
		sub { jlit(pick(O(total => 'sum'), [], 'add', O(total => R(1)), O('' => 'append'))) })->();
	return [ 'fold', 0, "SELECT dwarf_internal.fold_changes($input, $changes, $red)" ];
};
$GEN{composite} = sub {
	my ($id) = @_;
	my ($gname, $g) = pick_graph();
	my $in = jlit(gen_input($g, $id));
	my $gl = lit($gname);
	my $ir = "(SELECT id FROM dwarf.flow WHERE status = 'interrupted' ORDER BY id DESC LIMIT 1)";
	my $sql = pick(
		"DO \$d\$ DECLARE i bigint; BEGIN i := dwarf.create($gl, $in); PERFORM dwarf.cancel(i, 'same transaction'); END \$d\$",
		"DO \$d\$ DECLARE i bigint; BEGIN i := dwarf.create($gl, $in); PERFORM dwarf.await(i, '10 ms'); END \$d\$",
		"DO \$d\$ DECLARE i bigint; BEGIN i := dwarf.create($gl, $in); PERFORM dwarf.delete(i); END \$d\$",
		"DO \$d\$ DECLARE i bigint; BEGIN i := dwarf.create($gl, $in); PERFORM dwarf.resume(i, '1'); END \$d\$",
		"DO \$d\$ DECLARE i bigint; BEGIN i := dwarf.create($gl, $in); PERFORM dwarf.continue(i, '{}'); END \$d\$",
		"DO \$d\$ DECLARE i bigint; BEGIN i := dwarf.create($gl, $in); PERFORM * FROM dwarf.snapshot(i); PERFORM dwarf.history_mermaid(i); END \$d\$",
		"DO \$d\$ BEGIN BEGIN PERFORM dwarf.create($gl, $in); RAISE EXCEPTION 'undo' USING ERRCODE = 'P0002'; EXCEPTION WHEN no_data_found THEN NULL; END; END \$d\$",
		"DO \$d\$ BEGIN BEGIN PERFORM dwarf.cancel((SELECT id FROM dwarf.flow WHERE status = 'running' ORDER BY id DESC LIMIT 1)); RAISE EXCEPTION 'undo' USING ERRCODE = 'P0002'; EXCEPTION WHEN no_data_found THEN NULL; END; END \$d\$",
		"DO \$d\$ BEGIN PERFORM dwarf.define('fz_tx$id', '{\"tasks\": {\"A\": \"fz.noop\"}}'); PERFORM dwarf.run('fz_tx$id', '{}', timeout => '10 ms'); END \$d\$",
		"DO \$d\$ BEGIN PERFORM dwarf.define('fz_tx$id', '{\"tasks\": {\"A\": \"fz.noop\"}}'); PERFORM dwarf.create('fz_tx$id', '{}'); END \$d\$",
		"SELECT dwarf.create($gl, $in, idempotency_key => 'dup$id'), dwarf.create($gl, $in, idempotency_key => 'dup$id')",
		"SELECT count(dwarf.create($gl, $in)) FROM generate_series(1, " . pick(2, 20, 200) . ')',
		"SELECT count(*) FROM (SELECT dwarf.create($gl, $in) FROM generate_series(1, 5) UNION ALL SELECT 1/0) x",
		"SELECT (dwarf.run($gl, $in, timeout => '10 ms')).status FROM generate_series(1, 3)",
		"DO \$d\$ DECLARE i bigint := $ir; BEGIN PERFORM dwarf.resume(i, '{\"a\": 1}'); PERFORM dwarf.cancel(i); END \$d\$",
		"DO \$d\$ DECLARE i bigint := $ir; BEGIN PERFORM dwarf.resume(i, '1'); PERFORM dwarf.resume(i, '2'); END \$d\$",
		"DO \$d\$ DECLARE i bigint := $ir; BEGIN PERFORM dwarf.resume(i, '1'); PERFORM dwarf.delete(i); END \$d\$",
		"DO \$d\$ DECLARE i bigint := (SELECT id FROM dwarf.flow WHERE status IN ('completed', 'failed') ORDER BY id DESC LIMIT 1); BEGIN PERFORM dwarf.continue(i, '{}'); PERFORM dwarf.continue(i, '{}'); PERFORM dwarf.delete(i); END \$d\$",
		"SELECT dwarf.create($gl, $in, thread => 't$id') FROM generate_series(1, 3)",
		"DO \$d\$ DECLARE i bigint; BEGIN i := dwarf.create($gl, $in, delete_on_completion => true); COMMIT; END \$d\$",
		"SELECT dwarf.fork(s.step_id, '{}') FROM dwarf.step s ORDER BY s.step_id DESC LIMIT 3",
		"SELECT dwarf.cancel(id, 'sweep') FROM dwarf.flow WHERE status = 'running' AND parent_id IS NOT NULL ORDER BY id DESC LIMIT 2");
	return [ 'composite', chance(0.1), $sql ];
};
# Changes to a task function while graphs use it: a new function with the
# same name (a new oid), a new body, a revoked EXECUTE, a rename.
$GEN{ddl} = sub {
	my $body = pick(
		"SELECT jsonb_build_object('hops', fz.hops(s) + 1, 'eph', 1)",
		"SELECT jsonb_build_object('hops', fz.hops(s) + 1, 'eph', 2)",
		"SELECT '[1]'::jsonb", "SELECT (1/0)::text::jsonb");
	my $create = "CREATE FUNCTION fz.eph(s jsonb) RETURNS jsonb LANGUAGE sql AS \$e\$ $body \$e\$";
	my $sql = pick(
		"DO \$d\$ BEGIN DROP FUNCTION IF EXISTS fz.eph(jsonb); $create; END \$d\$",
		"DO \$d\$ BEGIN DROP FUNCTION IF EXISTS fz.eph(jsonb); $create; END \$d\$",
		"CREATE OR REPLACE FUNCTION fz.eph(s jsonb) RETURNS jsonb LANGUAGE sql AS \$e\$ $body \$e\$",
		'REVOKE EXECUTE ON FUNCTION fz.eph(jsonb) FROM PUBLIC',
		'GRANT EXECUTE ON FUNCTION fz.eph(jsonb) TO PUBLIC',
		'DROP FUNCTION fz.eph(jsonb)',
		$create,
		'ALTER FUNCTION fz.eph(jsonb) SET search_path = fz',
		'ALTER FUNCTION fz.eph(jsonb) SECURITY DEFINER',
		"DO \$d\$ BEGIN ALTER FUNCTION fz.eph(jsonb) RENAME TO eph2; ALTER FUNCTION fz.eph2(jsonb) RENAME TO eph; END \$d\$");
	return [ 'ddl', 0, $sql ];
};

my @KINDS = (
	define => 14, validate => 10, big => 0.3, create => 20, run => 7, await => 4, cancel => 4,
	resume => 4, fork => 3, continue => 3, delete => 2, purge => 0.3, read => 8, outside => 3,
	fold => 5, composite => 3, ddl => 0.6);
# DWARF_FUZZ_KINDS=create,run,... keeps only those kinds (to narrow a failure down).
if (my $only = $ENV{DWARF_FUZZ_KINDS})
{
	my %keep = map { $_ => 1 } split /,/, $only;
	my @k;
	for (my $i = 0; $i < @KINDS; $i += 2) { push @k, @KINDS[ $i, $i + 1 ] if $keep{ $KINDS[$i] }; }
	die "DWARF_FUZZ_KINDS names no known kind\n" unless @k;
	@KINDS = @k;
}

# ================================================================ the node

my $node = new_node('fuzz',
	log_statement    => "'none'",
	log_line_prefix  => "'%m [%p] %e %q%a '",
	deadlock_timeout => "'100ms'");
$node->safe_psql('postgres',
	"CREATE DATABASE fuzz ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");

# A query in the fuzz database; an error is shown, not fatal (the checks
# that follow then fail with what they found).
sub sql
{
	my ($query) = @_;
	my ($rc, $out, $err) = $node->psql('fuzz', $query, on_error_stop => 1);
	diag "query failed: $err\nquery: " . substr($query, 0, 500) if $rc != 0 || $err ne '';
	return $out;
}

sql(q{
CREATE EXTENSION dwarf;
CREATE ROLE fz_user;
GRANT USAGE ON SCHEMA dwarf TO fz_user;
CREATE SCHEMA fz;
GRANT USAGE ON SCHEMA fz TO fz_user;
CREATE TABLE fz.counter (n bigint);
INSERT INTO fz.counter VALUES (0);
GRANT SELECT, UPDATE ON fz.counter TO PUBLIC;

-- Helpers: an integer field of the state, or a default.
CREATE FUNCTION fz.int(s jsonb, k text, d int) RETURNS int LANGUAGE sql IMMUTABLE AS $$
	SELECT CASE WHEN jsonb_typeof(s->k) = 'number' AND (s->>k)::numeric BETWEEN -1000000 AND 1000000
	            THEN (s->>k)::numeric::int ELSE d END $$;
CREATE FUNCTION fz.hops(s jsonb) RETURNS int LANGUAGE sql IMMUTABLE AS $$
	SELECT greatest(fz.int(s, 'hops', 0), 0) $$;

-- The task functions.
-- Counts its visits in "hops"; a loop of 50 visits is a runaway: it stops.
CREATE FUNCTION fz.noop(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF fz.hops(s) >= 50 THEN
		RAISE EXCEPTION 'fuzz: % hops, a runaway loop', fz.hops(s) USING ERRCODE = 'P0003';
	END IF;
	RETURN jsonb_build_object('hops', fz.hops(s) + 1);
END $$;
CREATE FUNCTION fz.nil(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE FUNCTION fz.eph(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('hops', fz.hops(s) + 1, 'eph', 0) $$;
CREATE FUNCTION fz.secret(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"secret": true}'::jsonb $$;
REVOKE EXECUTE ON FUNCTION fz.secret(jsonb) FROM PUBLIC;
CREATE FUNCTION fz.raise(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE code text := s->>'code';
BEGIN
	-- any SQLSTATE but the internal ones (and the non-error classes)
	IF code IS NULL OR code !~ '^[0-9A-WYZ][0-9A-Z]{4}$' OR code ~ '^0[0-2]' THEN
		code := 'P0001';
	END IF;
	RAISE EXCEPTION USING MESSAGE = coalesce(s->>'msg', 'fuzz says no'), ERRCODE = code,
		DETAIL = coalesce(s->>'detail', 'none');
END $$;
CREATE FUNCTION fz.nonobj(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT (CASE s->>'nonobj' WHEN 'string' THEN '"str"' WHEN 'number' THEN '42'
	        WHEN 'null' THEN 'null' WHEN 'true' THEN 'true' WHEN 'nested' THEN '[{"a": 1}]'
	        ELSE '[]' END)::jsonb $$;
CREATE FUNCTION fz.sleeper(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := least(fz.int(s, 'naps', 1), 5000);
BEGIN
	FOR i IN 1 .. n LOOP
		PERFORM dwarf.sleep(coalesce(s->>'nap', '1 ms')::interval);
	END LOOP;
	RETURN jsonb_build_object('hops', fz.hops(s) + 1, 'napped', n);
END $$;
CREATE FUNCTION fz.goto(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	me text := regexp_replace(dwarf.step_key(), '^-?[0-9]+-[0-9]+-[0-9]+-', '');
	target text := coalesce(s->'gotos'->>me, s->>'goto');
BEGIN
	IF target IS NOT NULL AND fz.hops(s) < 6 THEN
		PERFORM dwarf.goto(target);
	END IF;
	RETURN jsonb_build_object('hops', fz.hops(s) + 1);
END $$;
CREATE FUNCTION fz.retry(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE tries int := fz.int(s, 'tries', 0);
BEGIN
	IF tries < least(fz.int(s, 'max_tries', 2), 20) THEN
		IF dwarf.retry(coalesce(s->>'r_init', '1 ms')::interval, coalesce(s->>'r_factor', '2')::float8,
		               coalesce(s->>'r_max', '10 ms')::interval, (s->>'r_give')::interval) THEN
			IF s ? 'r_twice' THEN
				PERFORM dwarf.retry('1 ms', 1, '1 ms');
			END IF;
			RETURN jsonb_build_object('tries', tries + 1);
		END IF;
		RAISE EXCEPTION 'retry gave up after % tries', tries;
	END IF;
	RETURN jsonb_build_object('hops', fz.hops(s) + 1);
END $$;
CREATE FUNCTION fz.intr(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE d jsonb;
BEGIN
	d := dwarf.interrupt(s->'payload');
	IF d IS NULL THEN RETURN NULL; END IF;
	IF s ? 'intr_twice' THEN
		d := dwarf.interrupt(d);
		IF d IS NULL THEN RETURN NULL; END IF;
	END IF;
	RETURN jsonb_build_object('resumed', d, 'hops', fz.hops(s) + 1);
END $$;
CREATE FUNCTION fz.sub(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
	r := dwarf.subgraph(s->>'sub', CASE WHEN s ? 'subin' THEN s->'subin' ELSE '{}' END);
	IF r IS NULL THEN RETURN NULL; END IF;
	RETURN jsonb_build_object('child', r, 'hops', fz.hops(s) + 1);
END $$;
CREATE FUNCTION fz.odd(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	kind text := coalesce(s->>'odd', 'ret');
	n int := greatest(fz.int(s, 'size', 1000), 0);
	r jsonb;
BEGIN
	CASE kind
	WHEN 'ret' THEN RETURN s->'ret';
	WHEN 'big' THEN RETURN jsonb_build_object('big', repeat('x', least(n, 4000000)), 'hops', fz.hops(s) + 1);
	WHEN 'wide' THEN
		SELECT jsonb_object_agg('k' || g, g) INTO r FROM generate_series(1, least(n, 50000)) g;
		RETURN r;
	WHEN 'deep' THEN
		RETURN jsonb_build_object('deep', (repeat('[', least(n, 200000)) || repeat(']', least(n, 200000)))::jsonb);
	WHEN 'deepobj' THEN
		RETURN (repeat('{"m": ', least(n, 200000)) || '1' || repeat('}', least(n, 200000)))::jsonb;
	WHEN 'nulls' THEN
		SELECT coalesce(jsonb_object_agg(k, 'null'::jsonb), '{}') INTO r FROM jsonb_object_keys(s) k;
		RETURN r;
	WHEN 'self' THEN RETURN s;
	WHEN 'numbers' THEN
		RETURN '{"n1": 1e1000, "n2": -0.0, "n3": 1e-1000, "total": 1e300, "lo": -1e300,
		         "hi": 123456789012345678901234567890, "x": 0.000001}'::jsonb;
	WHEN 'unicode' THEN
		RETURN jsonb_build_object(U&'\+01F600', U&'\202E', 'log', U&'\03A9', E'tab\tkey', E'\x01',
		                          's', U&'\FEFF');
	ELSE RETURN jsonb_build_object('odd', kind);
	END CASE;
END $$;
-- Runs a statement from the state inside the task.
CREATE FUNCTION fz.exec(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF s ? 'sql' THEN
		EXECUTE s->>'sql';
	END IF;
	RETURN jsonb_build_object('hops', fz.hops(s) + 1);
END $$;
CREATE FUNCTION fz.snooze(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(least(coalesce((s->>'snooze')::float8, 0.3), 1));
	RETURN jsonb_build_object('hops', fz.hops(s) + 1);
END $$;
-- What may not be a task.
CREATE FUNCTION fz.takes_int(n int) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION fz.returns_text(s jsonb) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;
CREATE FUNCTION fz.srf(s jsonb) RETURNS SETOF jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE PROCEDURE fz.proc(s jsonb) LANGUAGE sql AS $$ SELECT 1 $$;
CREATE AGGREGATE fz.agg(jsonb) (SFUNC = jsonb_concat, STYPE = jsonb, INITCOND = '{}');
CREATE FUNCTION fz.twoargs(s jsonb, n int DEFAULT 1) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;

-- The control graph: fan-out, fan-in, for_each, reducers, retry, sleep.
CREATE FUNCTION fz.c_start(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "Start"}'::jsonb $$;
CREATE FUNCTION fz.c_add(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"total": 1, "trail": "Add"}'::jsonb $$;
CREATE FUNCTION fz.c_join(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "Join"}'::jsonb $$;
CREATE FUNCTION fz.c_each(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('total', s->'it', 'trail', 'Each') $$;
CREATE FUNCTION fz.c_flaky(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF coalesce((s->>'tries')::int, 0) < 1 AND dwarf.retry('1 ms', 1, '1 ms') THEN
		RETURN '{"tries": 1}';
	END IF;
	PERFORM dwarf.sleep('1 ms');
	RETURN '{"trail": "Flaky"}';
END $$;
CREATE FUNCTION fz.c_done(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"done": true, "trail": "Done"}'::jsonb $$;
SELECT dwarf.define('fz_control', '{
  "entry": "Start",
  "tasks": {"Start": "fz.c_start", "B1": "fz.c_add", "B2": "fz.c_add", "Join": "fz.c_join",
            "Each": "fz.c_each", "Join2": "fz.c_join", "Flaky": "fz.c_flaky", "Done": "fz.c_done"},
  "transitions": [
    {"from": "Start", "to": ["B1", "B2"]},
    {"from": "B1", "to": "Join"}, {"from": "B2", "to": "Join"},
    {"from": "Join", "to": "Each", "for_each": "items", "as": "it"},
    {"from": "Each", "to": "Join2"},
    {"chain": ["Join2", "Flaky", "Done", "END"]}],
  "fan_in": ["Join", "Join2"],
  "reducers": {"total": "add", "trail": "append"}}');
SELECT dwarf.define('fz_leaf', '{"tasks": {"A": "fz.noop"}}');
SELECT dwarf.define('fz_bigchain', jsonb_build_object(
  'tasks', (SELECT jsonb_object_agg('t' || g, 'fz.noop') FROM generate_series(1, 2000) g),
  'transitions', jsonb_build_array(jsonb_build_object('chain',
    (SELECT jsonb_agg('t' || g ORDER BY g) FROM generate_series(1, 2000) g)))));
SELECT dwarf.define('fz_bigfan', jsonb_build_object(
  'entry', 'A',
  'tasks', jsonb_build_object('A', 'fz.noop', 'B', 'fz.noop', 'J', 'fz.noop'),
  'transitions', jsonb_build_array(
    jsonb_build_object('from', 'A', 'to', (SELECT jsonb_agg('B'::text) FROM generate_series(1, 1000))),
    jsonb_build_object('from', 'B', 'to', 'J')),
  'fan_in', jsonb_build_array('J')));

-- Bookkeeping, out of the fuzzed role's reach.
CREATE SCHEMA fuzz;
CREATE TABLE fuzz.result (
	id int PRIMARY KEY, kind text NOT NULL, as_user boolean NOT NULL, ok boolean NOT NULL,
	sqlstate text, message text, detail text, ms float8);
CREATE TABLE fuzz.step_err (
	flow_id bigint, step_id bigint, task text, sqlstate text, message text, fz text,
	parent_id bigint, PRIMARY KEY (flow_id, step_id));
CREATE TABLE fuzz.admin_err (at timestamptz DEFAULT clock_timestamp(), what text, sqlstate text, message text);

-- Runs one fuzz statement (as fz_user when asked) and records how it went.
CREATE FUNCTION fuzz.try(p_id int, p_kind text, p_as_user boolean, p_sql text) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE
	t0 timestamptz := clock_timestamp();
	st text;
	msg text;
	det text;
BEGIN
	BEGIN
		IF p_as_user THEN
			SET LOCAL ROLE fz_user;
		END IF;
		EXECUTE p_sql;
		RESET ROLE;
		INSERT INTO fuzz.result VALUES (p_id, p_kind, p_as_user, true, NULL, NULL, NULL,
			extract(epoch FROM clock_timestamp() - t0) * 1000);
		RETURN;
	EXCEPTION WHEN OTHERS OR query_canceled THEN
		GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
	END;
	INSERT INTO fuzz.result VALUES (p_id, p_kind, p_as_user, false, st, msg, left(det, 2000),
		extract(epoch FROM clock_timestamp() - t0) * 1000);
END $f$;

-- Cancels the flows that match a condition, one by one; records errors.
CREATE FUNCTION fuzz.cancel_where(cond text, reason text) RETURNS int LANGUAGE plpgsql AS $f$
DECLARE
	r record;
	n int := 0;
	st text;
	msg text;
BEGIN
	FOR r IN EXECUTE 'SELECT id FROM dwarf.flow f WHERE ' || cond || ' ORDER BY id' LOOP
		BEGIN
			PERFORM dwarf.cancel(r.id, reason);
			n := n + 1;
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
			INSERT INTO fuzz.admin_err (what, sqlstate, message) VALUES ('cancel ' || r.id, st, msg);
		END;
	END LOOP;
	RETURN n;
END $f$;

-- Cancels runaway flows (cond) every half second, until told to stop.
CREATE TABLE fuzz.reaper_stop (stop boolean);
CREATE PROCEDURE fuzz.reaper(cond text) LANGUAGE plpgsql AS $f$
BEGIN
	LOOP
		EXIT WHEN EXISTS (SELECT 1 FROM fuzz.reaper_stop);
		PERFORM fuzz.cancel_where(cond, 'fuzz: runaway');
		COMMIT;
		PERFORM pg_sleep(0.5);
	END LOOP;
END $f$;

-- Keeps the errors of failed steps (a later purge or delete may drop them).
CREATE FUNCTION fuzz.capture() RETURNS void LANGUAGE sql AS $f$
	INSERT INTO fuzz.step_err
	SELECT s.flow_id, s.step_id, s.task, s.error->>'sqlstate', s.error->>'message',
	       f.input->>'fz', f.parent_id
	  FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id
	 WHERE s.error IS NOT NULL
	ON CONFLICT DO NOTHING $f$;

-- Running flows that nothing explains: no step sleeping, no child open.
CREATE VIEW fuzz.unexplained AS
SELECT f.id, f.input->>'fz' AS fz, g.name AS graph,
       (SELECT count(*) FROM dwarf.step s WHERE s.flow_id = f.id) AS steps
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE f.status = 'running'
   AND NOT EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id AND s.wake_at > now())
   AND NOT EXISTS (SELECT 1 FROM dwarf.flow c WHERE c.parent_id = f.id
                    AND c.status IN ('running', 'interrupted'));
});
wait_for_workers($node, 'two workers run in the fuzz database', db => 'fuzz');

# The control flow, before any fuzz.
my $CONTROL_QUERY = q{
SET statement_timeout = '90 s';
SELECT status || ' ' || (state->>'total') || ' ' || (state->'trail')::text || ' '
       || (state->>'tries') || ' ' || (state->>'done') || ' ' || (state ?| ARRAY['it', 'itIndex', 'itCount'])::text
  FROM dwarf.run('fz_control', '{"items": [10, 20, 30]}', timeout => '60 s')};
my $CONTROL_EXPECTED =
  'completed 62 ["Start", "Add", "Add", "Join", "Each", "Each", "Each", "Join", "Flaky", "Done"] 1 true false';
is(sql($CONTROL_QUERY), $CONTROL_EXPECTED, 'the control flow completes before the fuzz');

# What must not change: the postmaster, a process a crash restart replaces,
# and the dwarf workers.
my $pidfile = $node->data_dir . '/postmaster.pid';
my ($postmaster_pid) = split /\n/, slurp_file($pidfile);
my $PIDS_QUERY = q{
SELECT string_agg(backend_type || ':' || pid, ' ' ORDER BY backend_type, pid)
  FROM pg_stat_activity
 WHERE backend_type IN ('checkpointer', 'dwarf worker', 'dwarf launcher')};
my $pids_before = sql($PIDS_QUERY);
note "processes at the start: $pids_before";

# ---------------------------------------------------------------- the inputs

# The pool: valid random graphs that the flows run.
my @inputs;    # [kind, as_user, sql], indexed by id
my $id = 0;
for my $p (1 .. 40)
{
	my $g = gen_graph(valid => 'strict', n => 1 + rint(12));
	my $name = "fz_pool$p";
	push @POOL, [ $name, $g ];
	$inputs[ ++$id ] = [ 'pool', 0, "SELECT dwarf.define('$name', " . jlit($g->{def}) . ')' ];
}
my $pool_ids = $id;
while ($id < $NINPUTS)
{
	my $kind = wpick(@KINDS);
	$id++;
	$inputs[$id] = $GEN{$kind}->($id);
}

# ---------------------------------------------------------------- running them

my %crash_suspects;
my $crashed = 0;

# The script for one psql session: each input through fuzz.try.
sub script_for
{
	my (@ids) = @_;
	my $s = "SET client_encoding = 'UTF8';\nSET statement_timeout = '6 s';\n";
	for my $i (@ids)
	{
		my ($kind, $as_user, $stmt) = @{ $inputs[$i] };
		$s .= "SELECT fuzz.try($i, '$kind', " . ($as_user ? 'true' : 'false') . ', ' . lit($stmt) . ");\n";
	}
	return encode_utf8($s);
}

# Runs the inputs with these ids in $sessions psql sessions at once.
sub run_inputs
{
	my ($sessions, @ids) = @_;
	my @runs;
	for my $s (0 .. $sessions - 1)
	{
		my @mine = @ids[ grep { $_ % $sessions == $s } 0 .. $#ids ];
		next unless @mine;
		my %r = (ids => \@mine, file => "$PostgreSQL::Test::Utils::tmp_check/fuzz_session_$s");
		open(my $fh, '>', "$r{file}.sql") or die "could not write $r{file}.sql: $!";
		print $fh script_for(@mine);
		close($fh);
		# psql reads and writes files: the sessions run on their own.
		$r{h} = IPC::Run::start(
			[ 'psql', '-XAtq', '-d', $node->connstr('fuzz'), '-f', "$r{file}.sql" ],
			'<', '/dev/null', '>', "$r{file}.out", '2>', "$r{file}.err",
			IPC::Run::timeout(900));
		push @runs, \%r;
	}
	for my $r (@runs)
	{
		$r->{h}->finish;
		$r->{err} = slurp_file("$r->{file}.err");
		my $lost = $r->{err} =~ /server closed the connection|connection to server .* lost|terminating connection|could not connect/;
		if ($r->{err} ne '')
		{
			diag 'psql said: ' . substr($r->{err}, 0, 2000);
		}
		my %seen = map { $_ => 1 } split /\n/,
		  sql('SELECT id FROM fuzz.result WHERE id IN (' . join(',', @{ $r->{ids} }) . ')');
		my @missing = grep { !$seen{$_} } @{ $r->{ids} };
		if (@missing)
		{
			# psql stops at a lost connection: the first missing input was running.
			$crash_suspects{ $missing[0] } = 1 if $lost;
			$crashed = 1 if $lost;
			diag scalar(@missing) . " inputs were not recorded, first $missing[0]"
			  . ($lost ? ' (the connection was lost while it ran)' : '');
		}
	}
}

# Flows that loop through their conditions never end: cancel those past 150
# steps (the big pool graphs take more on purpose).
my $RUNAWAY = q{f.status = 'running' AND f.id IN (SELECT flow_id FROM dwarf.step GROUP BY flow_id HAVING count(*) > 150)
 AND f.graph_id NOT IN (SELECT id FROM dwarf.graph WHERE name IN ('fz_bigchain', 'fz_bigfan'))};

sub between_batches
{
	sql("SELECT fuzz.cancel_where(\$c\$$RUNAWAY\$c\$, 'fuzz: runaway'); SELECT fuzz.capture();");
}

# The reaper cancels runaway flows while the inputs run.
my $reaper_file = "$PostgreSQL::Test::Utils::tmp_check/fuzz_reaper";
my $reaper = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('fuzz'), '-c', "CALL fuzz.reaper(\$c\$$RUNAWAY\$c\$)" ],
	'<', '/dev/null', '>', "$reaper_file.out", '2>', "$reaper_file.err", IPC::Run::timeout(1800));

my $t_fuzz = time;
run_inputs(1, 1 .. $pool_ids);
is(sql("SELECT count(*) FROM fuzz.result WHERE kind = 'pool' AND ok"), $pool_ids,
	'every pool graph is valid')
  or diag sql("SELECT id, sqlstate, message FROM fuzz.result WHERE kind = 'pool' AND NOT ok");

my $BATCH = 150;
for (my $lo = $pool_ids + 1; $lo <= $NINPUTS && !$crashed; $lo += $BATCH)
{
	my $hi = $lo + $BATCH - 1;
	$hi = $NINPUTS if $hi > $NINPUTS;
	my $tb = time;
	run_inputs(2, $lo .. $hi);
	my $tr = time;
	between_batches();
	note sprintf('inputs %d .. %d: %.1f s, then %.1f s', $lo, $hi, $tr - $tb, time - $tr);
	if (slurp_file($node->logfile) =~ /terminated by signal|was terminated by|PANIC|TRAP:/)
	{
		diag "a crash while inputs $lo .. $hi ran";
		$crash_suspects{$_} = 1 for $lo .. $hi;
		$crashed = 1;
	}
}
note sprintf('%d inputs ran in %.1f s', $NINPUTS, time - $t_fuzz);
if (%crash_suspects)
{
	my @s = sort { $a <=> $b } keys %crash_suspects;
	diag 'inputs that ran when the server crashed: ' . join(', ', @s[ 0 .. ($#s < 9 ? $#s : 9) ]);
	diag "input $_: " . substr($inputs[$_][2], 0, 2000) for @s[ 0 .. ($#s < 2 ? $#s : 2) ];
}

# ---------------------------------------------------------------- flows end

# Every flow that can run settles: it closes, or sleeps, waits for a child,
# or is interrupted.  Flows that loop are cancelled on the way.
my $t_settle = time;
my $unexplained;
while (time - $t_settle < 60)
{
	between_batches();
	$unexplained = sql('SELECT count(*) FROM fuzz.unexplained');
	last if $unexplained == 0;
	sleep(1);
}
sql('INSERT INTO fuzz.reaper_stop VALUES (true)');
$reaper->finish;
my $reaper_err = slurp_file("$reaper_file.err");
diag "the reaper said: $reaper_err" if $reaper_err ne '';
note sprintf('flows settled in %.1f s; %s runaway flows cancelled', time - $t_settle,
	sql("SELECT count(*) FROM dwarf.flow WHERE cancel_reason = 'fuzz: runaway'"));

# What is left and does not move while the workers are idle is a hang.
my $hung = '';
if ($unexplained > 0)
{
	my $STILL = q{SELECT string_agg(id || ':' || steps, ' ' ORDER BY id) FROM fuzz.unexplained};
	my $ACTIVE = q{SELECT (SELECT coalesce(sum(steps), 0) || '/' || coalesce(sum(ready), 0) FROM dwarf.worker_stats())
	  || '/' || (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf runner')};
	my ($s1, $a1) = (sql($STILL), sql($ACTIVE));
	sleep(5);
	my ($s2, $a2) = (sql($STILL), sql($ACTIVE));
	my %before = map { split /:/ } split / /, ($s1 // '');
	my %after  = map { split /:/ } split / /, ($s2 // '');
	my @still = grep { defined $before{$_} && $before{$_} == $after{$_} } sort keys %after;
	$hung = join(' ', @still) if @still && $a2 =~ m{^\d+/0/0$} && $a1 eq $a2;
}
is($hung, '', 'no flow that could run is left hanging')
  or diag sql("SELECT u.id, u.fz, u.graph, u.steps, f.priority, f.created_at,
                      (SELECT string_agg(s.task || '/' || s.status || '/' || coalesce(s.wake_at::text, '-'), ', ' ORDER BY s.step_id)
                         FROM dwarf.step s WHERE s.flow_id = u.id) AS steps
                 FROM fuzz.unexplained u JOIN dwarf.flow f USING (id) ORDER BY u.id LIMIT 10");

# Cancel what sleeps, waits or is interrupted on purpose (and any runaway).
my $left = sql(q{
SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
  FROM (SELECT status, count(*) n FROM dwarf.flow WHERE status IN ('running', 'interrupted') GROUP BY 1) x});
note 'flows left open: ' . ($left || 'none');
# A flow may fork itself (an input's task runs dwarf.fork at its own latest
# step, or dwarf.continue): a chain of new root flows, each made by its
# predecessor's step, that no cancel of the flows open at one moment ends,
# since the step that forked may have committed just after it; a chain
# whose every flow runs its step in the batch after the one that made it
# can outrun minutes of cancels (it did: 32,000 flows in six minutes).  So
# the fuzz's statements stop here: fz.exec, the one task that runs an
# input's statement, no longer runs it (a chain's next flow then makes none),
# and the cancel is repeated until no flow is open.  fz.exec is put back
# once they have all ended.
my $EXEC_BODY = sql(q{SELECT prosrc FROM pg_proc WHERE oid = 'fz.exec(jsonb)'::regprocedure});
sql(q{CREATE OR REPLACE FUNCTION fz.exec(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN jsonb_build_object('hops', fz.hops(s) + 1);
END $$});
my $open = -1;
for (my $tries = 0; $tries < 600 && $open != 0; $tries++)
{
	sql(q{SELECT fuzz.cancel_where($$f.status IN ('running', 'interrupted') AND f.parent_id IS NULL$$, 'fuzz: done');
	      SELECT fuzz.cancel_where($$f.status IN ('running', 'interrupted')$$, 'fuzz: done')});
	$open = sql(q{SELECT count(*) FROM dwarf.flow WHERE status IN ('running', 'interrupted')});
	sleep(0.2) if $open != 0;
}
is($open, '0', 'every fuzz flow ended')
  or diag sql(q{SELECT string_agg(f.id || ' ' || g.name || ' ' || f.status || ' ' || left(f.state::text, 200), E'\n')
                 FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
                WHERE f.status IN ('running', 'interrupted')});
sql("CREATE OR REPLACE FUNCTION fz.exec(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$$EXEC_BODY\$\$");
sql('SELECT fuzz.capture()');

# ---------------------------------------------------------------- results

note 'the slowest inputs: ' . sql(q{
SELECT string_agg(id || ' ' || kind || ' ' || round(ms::numeric) || ' ms', ', ' ORDER BY ms DESC)
  FROM (SELECT * FROM fuzz.result ORDER BY ms DESC LIMIT 12) x});
my $histogram = sql(q{
SELECT string_agg(coalesce(sqlstate, 'ok') || ': ' || n, ', ' ORDER BY n DESC, sqlstate)
  FROM (SELECT sqlstate, count(*) n FROM fuzz.result GROUP BY 1) x});
note "SQLSTATEs of the $NINPUTS inputs: $histogram";
note 'by kind (ok/refused, seconds): ' . sql(q{
SELECT string_agg(kind || ' ' || n_ok || '/' || n_no || ', ' || round(s::numeric, 1) || ' s', '; ' ORDER BY kind)
  FROM (SELECT kind, count(*) FILTER (WHERE ok) n_ok, count(*) FILTER (WHERE NOT ok) n_no, sum(ms) / 1000 s
          FROM fuzz.result GROUP BY kind) x});
note 'SQLSTATEs of failed steps: ' . sql(q{
SELECT string_agg(coalesce(sqlstate, '?') || ': ' || n, ', ' ORDER BY n DESC, sqlstate)
  FROM (SELECT sqlstate, count(*) n FROM fuzz.step_err GROUP BY 1) x});
note 'flows by status: ' . sql(q{
SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
  FROM (SELECT status, count(*) n FROM dwarf.flow GROUP BY 1) x}) . ', steps: ' . sql('SELECT count(*) FROM dwarf.step');

my $POISON = q{'^task ".*" ended the process running it [0-9]+ times; it is not run again$'};
my $INTERNAL = "sqlstate IN ('XX000', 'XX001', 'XX002') AND message !~ $POISON";

is(sql(qq{SELECT count(*) FROM fuzz.result WHERE NOT ok AND $INTERNAL}), '0',
	'no input was refused with an internal error (XX000, XX001, XX002)')
  or do
{
	for my $row (split /\n/, sql(qq{
SELECT id || '|' || sqlstate || '|' || replace(message, chr(10), ' ') FROM fuzz.result
 WHERE NOT ok AND $INTERNAL ORDER BY id LIMIT 10}))
	{
		my ($i, $st, $msg) = split /\|/, $row, 3;
		diag "input $i ($inputs[$i][0]" . ($inputs[$i][1] ? ', as fz_user' : '') . ") got $st: $msg";
		diag '  the input: ' . substr($inputs[$i][2], 0, 600);
	}
};
is(sql(q{SELECT count(*) FROM fuzz.result WHERE NOT ok AND (sqlstate IS NULL OR coalesce(message, '') = '')}),
	'0', 'every refusal has a SQLSTATE and a message')
  or diag sql(q{SELECT id, kind, sqlstate FROM fuzz.result WHERE NOT ok AND (sqlstate IS NULL OR coalesce(message, '') = '') LIMIT 10});
is(sql(qq{SELECT count(*) FROM fuzz.step_err WHERE $INTERNAL}), '0',
	'no step failed with an internal error (XX000, XX001, XX002)')
  or do
{
	for my $row (split /\n/, sql(qq{
SELECT coalesce(fz, '?') || '|' || flow_id || '|' || task || '|' || sqlstate || '|' || replace(message, chr(10), ' ')
  FROM fuzz.step_err WHERE $INTERNAL ORDER BY flow_id, step_id LIMIT 10}))
	{
		my ($i, $flow, $task, $st, $msg) = split /\|/, $row, 5;
		diag "flow $flow (input $i), task $task, failed with $st: $msg";
		diag '  the input: ' . substr($inputs[$i][2], 0, 600) if $i =~ /^\d+$/ && $inputs[$i];
	}
};
is(sql(qq{SELECT count(*) FROM fuzz.admin_err WHERE $INTERNAL}), '0',
	'cancelling the leftover flows met no internal error')
  or diag sql(q{SELECT what, sqlstate, message FROM fuzz.admin_err LIMIT 10});

# Every row can be read back (a timestamp out of range, say, would not).
my ($rc, $out, $err) = $node->psql('fuzz', q{
SELECT count(*) FROM (SELECT s::text FROM dwarf.step s) x;
SELECT count(*) FROM (SELECT f::text FROM dwarf.flow f) x;
SELECT count(*) FROM (SELECT g::text FROM dwarf.graph g) x;
SELECT count(*) FROM dwarf.stats});
is($err, '', 'every stored flow, step and graph row can be read back');

# ---------------------------------------------------------------- after

is(sql($CONTROL_QUERY), $CONTROL_EXPECTED, 'the control flow completes after the fuzz');
is(sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker'"), '2',
	'both dwarf workers still run');
is(sql($PIDS_QUERY), $pids_before,
	'the checkpointer, the launcher and the dwarf workers are the ones that started (no crash restart, no worker exit)');
my ($postmaster_now) = split /\n/, slurp_file($pidfile);
is($postmaster_now, $postmaster_pid, 'the postmaster is the one that started');

my $log = slurp_file($node->logfile);
my @internal = grep { !/ended the process running it/ } ($log =~ /^.*\] XX00[012] .*$/mg);
is(scalar(@internal), 0, 'no internal error in the server log')
  or diag join("\n", @internal[ 0 .. ($#internal < 9 ? $#internal : 9) ]);
unlike($log, qr/server process .* was terminated|database system is in recovery mode|terminated by signal|PANIC/,
	'the server log shows no crash');
# A replay that cannot follow a flow's recorded steps rebuilds it wrongly
# (its steps may run again).
my @replay = ($log =~ /^.*WARNING: +dwarf: .*$/mg);
is(scalar(@replay), 0, 'no dwarf warning in the server log (every flow replays from its steps)')
  or diag join("\n", @replay[ 0 .. ($#replay < 4 ? $#replay : 4) ]);
check_no_crash($node, 'no crash (DwarfTest)');
note 'server log: ' . (() = $log =~ /\] [0-9A-Z]{5} ERROR: /g) . ' errors, '
  . (() = $log =~ /\] [0-9A-Z]{5} WARNING: /g) . ' warnings, '
  . (() = $log =~ /could not create requested flows/g) . ' failed run batches';

stop_node($node, $t0);
done_testing();
