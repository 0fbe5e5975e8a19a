-- soak: a sleeping flow: Nap calls dwarf.sleep of 1-5 s, then Woke.  Not waited for.
\set ms random(1000, 5000)
SELECT dwarf.create('soak_sleep', jsonb_build_object('ms', :ms::int));
