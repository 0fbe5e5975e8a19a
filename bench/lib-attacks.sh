#!/bin/bash
# What bench/attacks.sh (issue 19's attacks) and bench/tenants.sh (issue
# 44's targets) share: a fresh cluster of their own, roles alice (the
# victim) and mallory (the attacker), a database per attack with the task
# functions and graphs both use, and alice's measured runs.  Sourced, not
# run.
#
# The caller sets PGBIN, WORK, PORT, BENCH (its name, for messages) and
# SERVER_CONF (postgresql.conf lines past the socket and
# shared_preload_libraries), may define db_extra (more setup of each new
# database, run after the common one, DB set), then calls
# bench_begin RESULT_FILE before anything else.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOCK=$WORK/sock
DATA=$WORK/data
ERR=$WORK/last.err
PSQL=$PGBIN/psql
TCK=$(getconf CLK_TCK)

die() { echo "$BENCH: $*" >&2; exit 1; }

BGPIDS=()
stop_all() {
	local p
	for p in "${BGPIDS[@]}"; do kill "$p" 2>/dev/null; done
	if [[ -f $DATA/postmaster.pid ]]; then
		runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -m immediate -w -t 60 stop >/dev/null 2>&1
	fi
	rm -rf "$DATA"
}

# bench_begin RESULT_FILE: the checks, then everything printed also goes to
# RESULT_FILE; the cluster and background jobs go at exit
bench_begin() {
	[[ $(id -u) == 0 ]] || die "run as root (the server runs as postgres; CPU is read from /proc)"
	[[ -x $PGBIN/postgres ]] || die "$PGBIN: no postgres binary"
	[[ -f $("$PGBIN/pg_config" --pkglibdir)/dwarf.so ]] || die "dwarf is not installed into $PGBIN/.."
	[[ -S $SOCK/.s.PGSQL.$PORT ]] && die "a server already listens on $SOCK/.s.PGSQL.$PORT"
	mkdir -p "$(dirname "$1")"
	exec > >(tee "$1") 2>&1
	trap stop_all EXIT
	trap 'exit 130' INT TERM
}

# ----------------------------------------------------------------- helpers

# q ROLE DB SQL...: each SQL in turn in one session (none: stdin); rows on
# stdout, the error (SQLSTATE: message) in $ERR; at most QT (60) seconds;
# STOP=0 goes on after an error.
q() {
	local role=$1 db=$2 s args=()
	shift 2
	for s in "$@"; do args+=(-c "$s"); done
	timeout "${QT:-60}" "$PSQL" -X -q -At -F '|' -h "$SOCK" -p "$PORT" -U "$role" -d "$db" \
		-v ON_ERROR_STOP="${STOP:-1}" -v VERBOSITY=verbose "${args[@]}" 2>"$ERR"
}
# the first error line of the last q, shortened
qerr() { grep -m1 -E '^(ERROR|FATAL|psql)' "$ERR" | sed -E 's/^ERROR: +//' | cut -c1-160 || true; }
# sq DB SQL...: as the superuser
sq() { q postgres "$@"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# poll DB SQL LIMIT_S: until SQL returns t, at most LIMIT_S seconds; 0 if it did
poll() {
	local db=$1 sql=$2 end=$(($(now_ms) + $3 * 1000))
	while (($(now_ms) < end)); do
		[[ $(QT=10 sq "$db" "$sql") == t ]] && return 0
		sleep 0.2
	done
	return 1
}
# CPU ticks of the postmaster and all its children (alive, or reaped by it)
server_ticks() {
	cat /proc/[0-9]*/stat 2>/dev/null | sed -E 's/ \(.*\) / X /' |
		awk -v pm="$PM" '$1 == pm || $4 == pm {t += $14 + $15 + $16 + $17} END {print t + 0}'
}
# private memory (RssAnon, MB) of DB's dwarf workers, summed
worker_rss_mb() {
	local p kb=0 k
	for p in $(sq "$1" "SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND datname = current_database()"); do
		k=$(awk '/^RssAnon:/ {print $2}' "/proc/$p/status" 2>/dev/null)
		kb=$((kb + ${k:-0}))
	done
	echo $((kb / 1024))
}
# dwarf processes of DB that are running something
BUSY="SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('dwarf worker', 'dwarf runner')
 AND datname = current_database() AND state = 'active'"
# statuses DB GRAPH: GRAPH's flows counted by status ("2 cancelled, 1 failed")
statuses() {
	sq "$1" "SELECT coalesce(string_agg(n || ' ' || status, ', ' ORDER BY status), 'none')
	  FROM (SELECT f.status, count(*) AS n FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	         WHERE g.name = '$2' GROUP BY f.status) s"
}

# ----------------------------------------------------------------- the server

start_server() {
	rm -rf "$DATA"
	mkdir -p "$WORK" "$SOCK"
	chown postgres: "$WORK" "$SOCK"
	runuser -u postgres -- "$PGBIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null ||
		die "initdb failed"
	cat >>"$DATA/postgresql.conf" <<-CONF
		listen_addresses = ''
		port = $PORT
		unix_socket_directories = '$SOCK'
		shared_preload_libraries = 'dwarf'
		$SERVER_CONF
	CONF
	: >"$WORK/server.log"
	chown postgres: "$WORK/server.log"
	runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -l "$WORK/server.log" -w -t 60 start >/dev/null ||
		die "the server did not start: $(tail -5 "$WORK/server.log")"
	PM=$(head -1 "$DATA/postmaster.pid")
	sq postgres "CREATE ROLE mallory LOGIN" "CREATE ROLE alice LOGIN" >/dev/null || die "roles: $(qerr)"
}

# restart_server: an immediate stop (what a stuck backend needs) and a start
restart_server() {
	runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -m immediate -w -t 60 stop >/dev/null 2>&1
	runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -l "$WORK/server.log" -w -t 120 start >/dev/null ||
		die "the server did not start again: $(tail -5 "$WORK/server.log")"
	PM=$(head -1 "$DATA/postmaster.pid")
}

# new_db NAME: database atk_NAME with dwarf, the task functions, and the two
# roles' graphs, then the caller's db_extra if it has one; sets DB.  Alice's
# graphs: quick (2 no-op steps), alice_slow (one 0.3 s step).  Mallory's:
# one per attack of attacks.sh.
new_db() {
	DB=atk_$1
	sq postgres "DROP DATABASE IF EXISTS $DB WITH (FORCE)" "CREATE DATABASE $DB" >/dev/null || die "$DB: $(qerr)"
	sq "$DB" "$(cat <<-'SQL'
	CREATE EXTENSION dwarf;
	GRANT USAGE ON SCHEMA dwarf TO alice, mallory;
	CREATE SCHEMA app;
	GRANT USAGE ON SCHEMA app TO PUBLIC;
	CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
	CREATE FUNCTION app.alice_slow(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
		SELECT pg_sleep(0.3); SELECT '{"slept": 0.3}'::jsonb $$;
	CREATE FUNCTION app.alice_reserve(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
		SELECT jsonb_build_object('graph', 'alice', 'ran_as', current_user::text) $$;
	CREATE FUNCTION app.spin(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
	BEGIN
		LOOP
		END LOOP;
	END $$;
	CREATE TABLE app.locked (flow_id bigint);
	GRANT INSERT ON app.locked TO PUBLIC;
	CREATE FUNCTION app.take_lock(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
		INSERT INTO app.locked VALUES (dwarf.flow_id()); SELECT '{"locked": true}'::jsonb $$;
	CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
		SELECT pg_sleep((s->>'sleep')::float8); SELECT '{}'::jsonb $$;
	CREATE FUNCTION app.forever(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM dwarf.goto('Loop');
		RETURN '{}';
	END $$;
	CREATE FUNCTION app.again(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
	BEGIN
		IF dwarf.retry('0 s', 1, '0 s') THEN
			RETURN '{}';
		END IF;
		RAISE EXCEPTION 'retry said no';
	END $$;
	CREATE FUNCTION app.split(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
		SELECT jsonb_build_object('items', (SELECT jsonb_agg(g) FROM generate_series(1, (s->>'n')::int) g)) $$;
	CREATE FUNCTION app.fork_self(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM dwarf.subgraph('bomb', '{"n": 3}');
		RETURN '{}';
	END $$;
	CREATE FUNCTION app.park(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM dwarf.sleep('1 hour');
		RETURN '{}';
	END $$;
	CREATE SCHEMA mallory_app AUTHORIZATION mallory;
	GRANT USAGE ON SCHEMA mallory_app TO PUBLIC;
	SQL
	)" >/dev/null || die "$DB setup: $(qerr)"
	q alice "$DB" "SELECT dwarf.define('quick', '{\"tasks\": {\"A\": \"app.noop\", \"B\": \"app.noop\"},
	    \"transitions\": [{\"from\": \"A\", \"to\": \"B\"}]}')" \
		"SELECT dwarf.define('alice_slow', '{\"tasks\": {\"S\": \"app.alice_slow\"}}')" >/dev/null ||
		die "$DB alice's graphs: $(qerr)"
	q mallory "$DB" "$(cat <<-'SQL'
	SELECT dwarf.define('spin', '{"tasks": {"S": "app.spin"}}');
	SELECT dwarf.define('lock', '{"tasks": {"L": "app.take_lock"}}');
	SELECT dwarf.define('nap', '{"tasks": {"N": "app.nap"}}');
	SELECT dwarf.define('self_goto', '{"entry": "Loop", "tasks": {"Loop": "app.forever"},
	  "transitions": [{"from": "Loop", "to": "Loop", "goto": true}]}');
	SELECT dwarf.define('again', '{"tasks": {"Again": "app.again"}}');
	SELECT dwarf.define('each', '{"tasks": {"Split": "app.split", "Work": "app.noop"},
	  "transitions": [{"from": "Split", "to": "Work", "for_each": "items"}]}');
	SELECT dwarf.define('bomb', '{"tasks": {"Split": "app.split", "Fork": "app.fork_self"},
	  "transitions": [{"from": "Split", "to": "Fork", "for_each": "items"}]}');
	SELECT dwarf.define('park', '{"tasks": {"Park": "app.park", "After": "app.noop"},
	  "transitions": [{"from": "Park", "to": "After"}]}');
	SQL
	)" >/dev/null || die "$DB mallory's graphs: $(qerr)"
	if declare -F db_extra >/dev/null; then db_extra || die "$DB: db_extra failed: $(qerr)"; fi
	poll "$DB" "SELECT count(*) = current_setting('dwarf.workers')::int FROM pg_stat_activity
	  WHERE backend_type = 'dwarf worker' AND datname = current_database()" 30 ||
		echo "  WARNING: $DB's dwarf workers did not all start"
}

# end_db: cancel every open flow (none with SKIP_CANCEL; roots first: a cancel takes a flow's
# subgraph flows with it), wait until no dwarf process is busy, drop the
# database.  Prints how long the cancel took and what stayed (also in
# CLEAN_TXT).
end_db() {
	local t0 n left
	t0=$(now_ms)
	if [[ -n ${SKIP_CANCEL:-} ]]; then
		n="no"
	else
		n=$(QT=${CANCEL_QT:-60} sq "$DB" "SET statement_timeout = 0" \
			"SELECT count(*) FILTER (WHERE dwarf.cancel(id, 'bench cleanup'))
			   FROM dwarf.flow WHERE status IN ('running', 'interrupted') AND parent_id IS NULL" \
			"SELECT count(*) FILTER (WHERE dwarf.cancel(id, 'bench cleanup'))
			   FROM dwarf.flow WHERE status IN ('running', 'interrupted')" | awk '{n += $1} END {if (NR) print n}')
		[[ -n $n ]] || n="? ($(qerr))"
	fi
	poll "$DB" "SELECT ($BUSY) = 0" 30 || echo "  cleanup: dwarf processes still busy 30 s after the cancel"
	left=$(QT=10 sq "$DB" "SELECT count(*) FROM dwarf.flow WHERE status = 'running'")
	CLEAN_TXT="the cleanup's cancel of $n flows took $(($(now_ms) - t0)) ms, then ${left:-?} running"
	echo "  cleanup: cancelled $n flows in $(($(now_ms) - t0)) ms; still running: ${left:-?}"
	drop_db "$DB"
}

# drop_db DB: DROP DATABASE ... WITH (FORCE), tried up to 5 times: it gives
# up after 5 s while a process it signalled has not exited yet (a dwarf
# process busy with a large cleanup), and a database left behind keeps its
# workers' slots
drop_db() {
	local i
	for i in 1 2 3 4 5; do
		QT=90 sq postgres "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null && return 0
		echo "  cleanup: DROP DATABASE $1, try $i: $(qerr)"
		sleep 2
	done
	return 1
}

# alice_runs: 10 sequential 2-step runs of alice's in one session (after
# one that warms the session up), each with timeout 2 s and
# statement_timeout 3 s; sets A_OK (completed), A_MED, A_MAX (ms; a run that
# raised an error counts 3000), A_TXT ("median / max", with what failed),
# A_PASS (all 10 completed, the slowest under 1 s), A_CPU (server cores
# meanwhile).
alice_runs() {
	local i t0 c0 out st ms line times=() notes=()
	A_OK=0
	t0=$(now_ms) c0=$(server_ticks)
	out=$({
		echo "SET statement_timeout = '3 s';"
		echo "SELECT status FROM dwarf.run('quick', '{}', timeout => '2 s') \\g /dev/null"
		for i in $(seq 1 10); do
			echo "SELECT $i, r.status, round(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000, 2)
			   FROM dwarf.run('quick', '{\"i\": $i}', timeout => '2 s') r;"
		done
	} | STOP=0 QT=60 q alice "$DB")
	for i in $(seq 1 10); do
		line=$(grep -m1 "^$i|" <<<"$out")
		IFS='|' read -r _ st ms <<<"$line"
		if [[ $st == completed ]]; then
			A_OK=$((A_OK + 1))
			times+=("$ms")
		elif [[ -n $line ]]; then
			times+=("$ms")
			notes+=("$st")
		else
			times+=(3000)
			notes+=("error")
		fi
	done
	grep -q ERROR "$ERR" && notes+=("$(qerr)")
	A_RSS=$(worker_rss_mb "$DB")
	A_CPU=$(awk -v t="$(($(server_ticks) - c0))" -v s="$(($(now_ms) - t0))" -v k="$TCK" \
		'BEGIN {printf "%.2f", (s > 0 ? t / k / (s / 1000) : 0)}')
	read -r A_MED A_MAX < <(printf '%s\n' "${times[@]}" | sort -g |
		awk '{v[NR] = $1} END {printf "%.1f %.1f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[NR]}')
	A_TXT="$A_MED / $A_MAX"
	A_PASS=$([[ $A_OK == 10 ]] && awk -v m="$A_MAX" 'BEGIN {exit !(m < 1000)}' && echo 1 || echo 0)
	((A_OK < 10)) && A_TXT+=" ($A_OK/10 completed: $(printf '%s\n' "${notes[@]}" | sort | uniq -c | awk '{$1 = $1 "x"; print}' | paste -sd';' | cut -c1-140))"
	echo "  alice: $A_OK of 10 runs completed; median $A_MED ms, max $A_MAX ms; server CPU ${A_CPU} cores meanwhile"
	echo "    each, ms: ${times[*]}"
}

# alice_slow: wall time (ms) of alice's 0.3 s flow, or "STATUS after N ms"
alice_slow() {
	local s0 out st ms
	s0=$(now_ms)
	out=$(QT=20 q alice "$DB" "SET statement_timeout = '15 s'" \
		"SELECT r.status, round(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000)
		   FROM dwarf.run('alice_slow', '{}', timeout => '12 s') r")
	IFS='|' read -r st ms <<<"$out"
	if [[ $st == completed ]]; then echo "$ms"; else echo "${st:-$(qerr)} after $(($(now_ms) - s0))"; fi
}

verdict() { (($1)) && echo PASS || echo FAIL; }

# log_summary: the server log's errors and failed processes, the commonest
# first (not counting dwarf workers stopped because their database is
# dropped)
log_summary() {
	local bad
	bad=$(grep -E '(PANIC|FATAL|ERROR|WARNING):|terminated by signal|exited with exit code [1-9]' "$WORK/server.log" |
		grep -vE 'dwarf worker" \(PID [0-9]+\) exited with exit code 1$|terminating background worker "dwarf (worker|runner)" due to administrator command' || true)
	echo "server log ($WORK/server.log): $(grep -c . <<<"$bad" || true) lines with ERROR, FATAL, PANIC, WARNING or a"
	echo "failed process (not counting dwarf workers stopped because their database is dropped); the commonest:"
	[[ -z $bad ]] || sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //; s/[0-9]+/N/g' <<<"$bad" |
		sort | uniq -c | sort -rn | head -8 | sed 's/^/    /'
}
