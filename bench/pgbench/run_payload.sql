-- One flow per transaction carrying :bytes of random hex text in its input
-- through 10 no-op steps (the carry workload): what a large state costs when
-- no step changes it.
-- Graph: bench/dwarf-bench -workload carry -steps 10 -setup-only
\set bytes 1024
SELECT 1 / (status = 'completed')::int AS completed
FROM dwarf.run('bench_carry_10', jsonb_build_object('payload',
     left((SELECT string_agg(md5(random()::text), '') FROM generate_series(0, :bytes / 32)), :bytes)));
