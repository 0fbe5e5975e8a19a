-- soak: a quick flow, ten no-op steps, run to completion (the caller waits).
-- The status is not checked here (a failed run would abort the pgbench
-- client and thin out the load); bench/soak.sh counts outcomes in the tables.
SELECT status FROM dwarf.run('soak_quick', '{}', timeout => '30 s');
