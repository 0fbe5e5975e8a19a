-- soak: an interrupting flow: Ask calls dwarf.interrupt and parks; the resume
-- loop of bench/soak.sh resumes it resume_after (2-5) s later; then Done.
\set wait random(2, 5)
SELECT dwarf.create('soak_interrupt', jsonb_build_object('resume_after', :wait::int));
