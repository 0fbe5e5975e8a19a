#!/bin/bash
# Every measurement of bench/README.md's results table, against one server
# that preloads dwarf (see Setup).  About 20 minutes.  Progress lines go to
# the terminal's stderr; summaries to stdout; raw results to bench/results/.
#   DSN="host=/var/tmp/dwarfbench port=5480 dbname=bench" bench/run-all.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p bench/results
DSN=${DSN:-"host=/var/tmp/dwarfbench port=5480 dbname=bench"}
B=./bench/dwarf-bench
O="-out bench/results/results.json"
run() { echo "### $*"; timeout 600 $B -dsn "$DSN" "$@" $O 2>&1 | grep -v "^linear\|^fanout\|^state\|^carry\|^reference\|^wait\|^mixed"; }
run -workload linear -steps 10 -concurrency 8,32,64 -warmup 5 -window 20 -stats-interval 5 -reference -label linear10-closed -csv bench/results/intervals-closed.csv
run -workload linear -steps 10 -concurrency 4 -arrival-rate 0 -max-outstanding 2000 -warmup 5 -window 20 -stats-interval 5 -reference -label linear10-saturated
run -workload linear -steps 10 -concurrency 4 -arrival-rate 1000,2000,3900,6000 -max-outstanding 20000 -warmup 3 -window 15 -stats-interval 5 -label linear10-open -csv bench/results/intervals-open.csv
run -workload fanout -width 16 -concurrency 32 -warmup 5 -window 20 -stats-interval 5 -reference -label fanout16-closed
run -workload fanout -width 16 -concurrency 4 -arrival-rate 0 -max-outstanding 200 -warmup 5 -window 20 -stats-interval 5 -reference -label fanout16-saturated
run -workload state -steps 10 -payload 8192 -payload-json -concurrency 8 -warmup 5 -window 20 -stats-interval 5 -reference -label state8k-json
run -workload carry -steps 10 -payload 8192 -payload-json -concurrency 8 -warmup 5 -window 20 -stats-interval 5 -reference -label carry8k-json
run -workload linear -steps 10 -concurrency 32 -warmup 5 -window 240 -stats-interval 5 -reference -label linear10-long -csv bench/results/intervals-long.csv
echo DONE
