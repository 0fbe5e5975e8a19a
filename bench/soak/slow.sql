-- soak: a slow flow, Pre -> Slow (pg_sleep of 300-800 ms) -> Post.  Slow runs
-- in a runner worker once dwarf knows it is slow (bench/soak.sh teaches it).
-- Created, not waited for: a client waiting ~1 s per flow would eat the load.
\set ms random(300, 800)
SELECT dwarf.create('soak_slow', jsonb_build_object('ms', :ms::int));
