#!/bin/sh
# Charts (SVG) from dwarf-bench output.  Needs gnuplot (gnuplot-nox) and jq.
#
#   bench/plot.sh [-o DIR] [intervals.csv] [results.json]
#
# From the -csv progress rows:  DIR/throughput.svg  steps/s per interval (and
#                               reference writes/s), DIR/latency.svg  p50/p99.
# From the -out results:        DIR/load-latency.svg  p50/p95/p99 against the
#                               offered load (open loop: arrival rate; closed
#                               loop: flows/s achieved), a line per label and
#                               workload.
# Either input may be omitted; files are recognised by their .csv/.json names.
set -eu

out=.
if [ "${1:-}" = "-o" ]; then
	out=$2
	shift 2
fi
[ $# -gt 0 ] || { echo "usage: $0 [-o DIR] [intervals.csv] [results.json]" >&2; exit 2; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

svg="set terminal svg size 1000,500 dynamic noenhanced font 'sans,11'; set grid; set key outside right"

for f in "$@"; do
	case $f in
	*.csv)
		# Columns: unix_s workload mode concurrency arrival_rate phase elapsed_s
		# flows_s steps_s p50_ms p99_ms backlog errors label.  A blank line
		# between windows keeps gnuplot from joining them.
		awk -F, -v dir="$tmp" '
			NR == 1 { next }
			NR == 2 { t0 = $1 }
			{
				file = dir "/" ($3 == "reference" ? "ref" : "dwarf") ".dat"
				key = $2 " " $3 " " $4 " " $5
				if (key != last[file])
					print "" > file
				last[file] = key
				print $1 - t0, $9, ($10 == "" ? "NaN" : $10), ($11 == "" ? "NaN" : $11), $4 > file
			}' "$f"
		touch "$tmp/dwarf.dat" "$tmp/ref.dat"
		gnuplot -e "$svg; set output '$out/throughput.svg';
			set title 'throughput per interval'; set xlabel 'seconds since start';
			set ylabel 'per second'; set yrange [0:*];
			plot '$tmp/dwarf.dat' using 1:2 with linespoints pt 7 ps 0.5 title 'dwarf steps/s',
			     '$tmp/ref.dat' using 1:2 with linespoints pt 7 ps 0.5 title 'reference writes/s'"
		gnuplot -e "$svg; set output '$out/latency.svg';
			set title 'flow latency per interval'; set xlabel 'seconds since start';
			set ylabel 'ms'; set logscale y;
			plot '$tmp/dwarf.dat' using 1:3 with linespoints pt 7 ps 0.5 title 'p50',
			     '' using 1:4 with linespoints pt 7 ps 0.5 title 'p99'"
		echo "wrote $out/throughput.svg $out/latency.svg"
		;;
	*.json)
		# One block per label, workload and mode, in sweep order
		# (concurrency, then arrival rate).
		jq -r 'select(.mode != "reference")
			| [((.label + " " + .workload + " " + .mode) | gsub("[ \t]+"; "_")),
			   .concurrency, (.arrival_rate // 0),
			   (if .mode == "open" and .arrival_rate > 0 then .arrival_rate else .flows_s end),
			   .p50_ms, .p95_ms, .p99_ms] | map(tostring) | join(" ")' "$f" |
			sed 's/null/NaN/g' | sort -k1,1 -k2,2n -k3,3g |
			awk -v dir="$tmp" '
				$1 != last { n++; if (n > 1) print "\n" > (dir "/load.dat"); print $1 > (dir "/groups") }
				{ last = $1; print $4, $5, $6, $7 > (dir "/load.dat") }'
		[ -s "$tmp/load.dat" ] || { echo "$f: no dwarf results" >&2; exit 1; }
		groups=$(tr '\n' ' ' < "$tmp/groups")
		n=$(wc -l < "$tmp/groups")
		gnuplot -e "$svg; set output '$out/load-latency.svg'; groups = '$groups';
			set title 'latency against offered load'; set xlabel 'flows/s offered (closed loop: achieved)';
			set ylabel 'ms'; set logscale y;
			plot for [i=1:$n] '$tmp/load.dat' index (i-1) using 1:2 with linespoints pt 7 dt 1 lc i title word(groups, i).' p50',
			     for [i=1:$n] '' index (i-1) using 1:3 with linespoints pt 5 dt 2 lc i title word(groups, i).' p95',
			     for [i=1:$n] '' index (i-1) using 1:4 with linespoints pt 9 dt 3 lc i title word(groups, i).' p99'"
		echo "wrote $out/load-latency.svg"
		;;
	*)
		echo "$0: $f: expected a .csv (from -csv) or .json (from -out) file" >&2
		exit 2
		;;
	esac
done
