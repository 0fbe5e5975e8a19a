-- One fan-out flow per transaction: Split, :width parallel Work branches
-- (for_each), then a Join fan-in; :width + 2 steps.
-- Graph: bench/dwarf-bench -workload fanout -setup-only
\set width 16
SELECT 1 / (status = 'completed')::int AS completed
FROM dwarf.run('bench_fanout', jsonb_build_object('width', :width::int));
