-- The linear workload with every per-flow option of dwarf.run in use:
-- priority, a fairness key and weight (8 tenants), a time budget, baggage
-- and a thread.  Compare with run_linear.sql in the same run.
\set tenant random(1, 8)
SELECT 1 / (status = 'completed')::int AS completed
FROM dwarf.run('bench_linear_10', '{}', priority => :tenant % 2,
               fairness_key => 'tenant' || :tenant, fairness_weight => :tenant,
               time_budget => '10 s', baggage => '{"tenant": true}', thread => 'bench');
