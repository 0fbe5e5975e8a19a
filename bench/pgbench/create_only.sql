-- One dwarf.create per transaction, without waiting for the flow: the rate at
-- which dwarf accepts work.  The flows run on in the background, so watch the
-- backlog: SELECT count(*) FROM dwarf.flow WHERE status = 'running';
-- Graph: bench/dwarf-bench -workload linear -steps 10 -setup-only
SELECT dwarf.create('bench_linear_10', '{}');
