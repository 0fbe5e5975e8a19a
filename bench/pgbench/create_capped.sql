-- Bulk creates under a cap on open flows: a closed loop that keeps the dwarf
-- workers busy without an unbounded backlog (bench/steplog-soak.sh).
-- Each transaction makes :per_txn flows in one statement when fewer than
-- :cap flows of the graph are open, else waits 10 ms and looks again; the
-- open count is dwarf.graph_stats' committed counters (shared memory, no
-- table read), so the cap is overshot by at most clients x per_txn.
--   pgbench -n -f create_capped.sql -D per_txn=200 -D cap=4000 -c 4 ...
-- Graph: bench/dwarf-bench -workload linear -steps 10 -setup-only
SELECT coalesce((SELECT flows_created - flows_completed - flows_failed - flows_cancelled
                   FROM dwarf.graph_stats WHERE graph = 'bench_linear_10'), 0) AS open \gset
\if :open < :cap
SELECT count(dwarf.create('bench_linear_10', '{}')) FROM generate_series(1, :per_txn);
\else
\sleep 10 ms
\endif
