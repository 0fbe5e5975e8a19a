-- soak: schema soak, its task functions and graphs (bench/soak.sh runs this).
-- Rerunnable: functions are replaced; a graph gets a new version only when its
-- definition changed (each version stays cached in the workers, which would
-- show as memory growth from run to run).
SET client_min_messages = warning;
CREATE SCHEMA IF NOT EXISTS soak;

CREATE OR REPLACE FUNCTION soak.noop(s jsonb) RETURNS jsonb LANGUAGE sql
    AS $$ SELECT '{}'::jsonb $$;

CREATE OR REPLACE FUNCTION soak.slow(s jsonb) RETURNS jsonb LANGUAGE sql
    AS $$ SELECT pg_sleep(coalesce((s->>'ms')::int, 500) / 1000.0);
          SELECT jsonb_build_object('slept_ms', coalesce((s->>'ms')::int, 500)) $$;

CREATE OR REPLACE FUNCTION soak.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'soak: planned failure'; END $$;

CREATE OR REPLACE FUNCTION soak.handle(s jsonb) RETURNS jsonb LANGUAGE sql
    AS $$ SELECT jsonb_build_object('handled', s->'onErr'->>'message') $$;

-- Succeeds on attempt number s.need (2 or 3); the attempts before ask for a retry.
CREATE OR REPLACE FUNCTION soak.flaky(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE tries int := coalesce((s->>'tries')::int, 0) + 1;
BEGIN
    IF tries < coalesce((s->>'need')::int, 2) THEN
        IF dwarf.retry('100 ms', 2, '1 s', give_up_after => '1 min') THEN
            RETURN jsonb_build_object('tries', tries);
        END IF;
        RAISE EXCEPTION 'soak: retry gave up after % tries', tries;
    END IF;
    RETURN jsonb_build_object('tries', tries, 'ok', true);
END $$;

CREATE OR REPLACE FUNCTION soak.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM dwarf.sleep(make_interval(secs => coalesce((s->>'ms')::int, 1000) / 1000.0));
    RETURN jsonb_build_object('napped_ms', coalesce((s->>'ms')::int, 1000));
END $$;

CREATE OR REPLACE FUNCTION soak.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE d jsonb := dwarf.interrupt(jsonb_build_object('ask', 'soak approval',
                                                      'resume_after', s->'resume_after'));
BEGIN
    IF d IS NULL THEN RETURN NULL; END IF;      -- parked; runs again on resume
    RETURN jsonb_build_object('answer', d);
END $$;

-- Flows of these graphs that ended wrongly (failed when they should not, or
-- completed with the wrong state), as the sampler finds them.
CREATE TABLE IF NOT EXISTS soak.odd (
    flow_id     bigint PRIMARY KEY,
    graph       text NOT NULL,
    status      text NOT NULL,
    what        text NOT NULL,
    error       text,
    finished_at timestamptz,
    seen_at     timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION soak.define(name text, definition jsonb) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE v int;
BEGIN
    SELECT g.version INTO v FROM dwarf.graph g
     WHERE g.name = define.name AND g.definition = dwarf.validate(define.definition)
       AND g.version = (SELECT max(version) FROM dwarf.graph WHERE graph.name = define.name);
    RETURN coalesce(v, dwarf.define(name, definition));
END $$;

SELECT soak.define('soak_quick', '{"tasks": {"Q1": "soak.noop", "Q2": "soak.noop", "Q3": "soak.noop",
    "Q4": "soak.noop", "Q5": "soak.noop", "Q6": "soak.noop", "Q7": "soak.noop", "Q8": "soak.noop",
    "Q9": "soak.noop", "Q10": "soak.noop"},
  "transitions": [{"chain": ["Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8", "Q9", "Q10", "END"]}]}') \g /dev/null
SELECT soak.define('soak_slow', '{"tasks": {"Pre": "soak.noop", "Slow": "soak.slow", "Post": "soak.noop"},
  "transitions": [{"chain": ["Pre", "Slow", "Post", "END"]}]}') \g /dev/null
SELECT soak.define('soak_fail', '{"tasks": {"A": "soak.noop", "Boom": "soak.boom"},
  "transitions": [{"chain": ["A", "Boom", "END"]}]}') \g /dev/null
SELECT soak.define('soak_fail_handled', '{"tasks": {"A": "soak.noop", "Boom": "soak.boom", "Handle": "soak.handle"},
  "transitions": [{"from": "A", "to": "Boom"}, {"from": "Boom", "to": "END"},
                  {"from": "Boom", "to": "Handle", "on_error": true}, {"from": "Handle", "to": "END"}]}') \g /dev/null
SELECT soak.define('soak_retry', '{"tasks": {"Flaky": "soak.flaky", "Done": "soak.noop"},
  "transitions": [{"chain": ["Flaky", "Done", "END"]}]}') \g /dev/null
SELECT soak.define('soak_sleep', '{"tasks": {"Nap": "soak.nap", "Woke": "soak.noop"},
  "transitions": [{"chain": ["Nap", "Woke", "END"]}]}') \g /dev/null
SELECT soak.define('soak_interrupt', '{"tasks": {"Ask": "soak.ask", "Done": "soak.noop"},
  "transitions": [{"chain": ["Ask", "Done", "END"]}]}') \g /dev/null
