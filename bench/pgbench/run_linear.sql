-- One linear flow of 10 no-op steps per transaction, run to completion.
-- Graph: bench/dwarf-bench -workload linear -steps 10 -setup-only
-- A flow that does not complete (failed, timed out) divides by zero, so
-- pgbench aborts that client instead of counting it as a transaction.
SELECT 1 / (status = 'completed')::int AS completed
FROM dwarf.run('bench_linear_10', '{}');
