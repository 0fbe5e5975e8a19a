#!/bin/bash
# The test command.  Run as root from anywhere:  sudo scripts/test.sh
#
# 1. scripts/deps.sh (packages; fast when already installed)
# 2. make && make install in the repository, as root; then
#    scripts/module-deps.py: no cycle between the modules of src/
# 3. copies the tree to a fresh directory owned by the postgres user (PostgreSQL
#    refuses to run as root) and there, as postgres:
#      make installcheck        pg_regress; starts its own instance (REGRESS_OPTS)
#      make prove_installcheck  TAP tests in t/*.pl, if any
#      pg_prove                 pgTAP tests in test/pgtap/*.sql, if any, against a
#                               throwaway cluster that preloads dwarf
#      examples/run.sh          the example apps, against a throwaway cluster of
#                               their own
#      scripts/readme-sql.py    every ```sql block of README.md, in one psql
#                               session, on a throwaway cluster of its own
# The last line of output is "N passed, M failed" (the module check +
# pg_regress tests + TAP files + pgTAP files + examples + README.md); the exit status is
# 0 only when M is 0 and N > 0.
#
# Environment: DWARF_TEST_BUDGET  seconds for the whole run (default 3000)
#              DWARF_TEST_KEEP=1  keep the work directory even when all passed
set -euo pipefail
exec 2>&1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PG_BIN=/usr/lib/postgresql/15/bin
PG_CONFIG=$PG_BIN/pg_config
export PATH="$PG_BIN:$PATH"

BUDGET=${DWARF_TEST_BUDGET:-3000}
DEADLINE=$(($(date +%s) + BUDGET))
LOG_TAIL=400 # lines shown of each server/TAP log on failure

PASSED=0
FAILED=0
SUMMARY=()
WORK=""
PGTAP_DIR=""

say() { printf '\n=== %s\n' "$*"; }
record() { # record SUITE PASSED FAILED [NOTE]
	PASSED=$((PASSED + $2))
	FAILED=$((FAILED + $3))
	SUMMARY+=("$(printf '%-11s %3d passed, %3d failed%s' "$1:" "$2" "$3" "${4:+  ($4)}")")
}

# bounded LOG CAP CMD...: run CMD with its output shown and appended to LOG,
# killed after min(CAP, time left) seconds.  Returns CMD's status (124: timeout).
# timeout(1) puts CMD in a process group of its own, whose id is kept in
# BOUNDED_PID so that finish() can end the whole group if we are interrupted.
BOUNDED_PID=""
bounded() {
	local log=$1 cap=$2 left secs rc fd tee_pid i what
	shift 2
	what="$*"
	if [[ $1 == "${AS_PG[0]}" ]]; then # show "(as postgres in DIR) CMD..."
		what="(as postgres in ${*:${#AS_PG[@]}+1:1}) ${*:${#AS_PG[@]}+2}"
	fi
	left=$((DEADLINE - $(date +%s)))
	secs=$((cap < left ? cap : left))
	if ((secs < 10)); then
		echo "test.sh: time budget (${BUDGET}s) exhausted; not running: $what" | tee -a "$log"
		return 124
	fi
	exec {fd}> >(tee -a "$log")
	tee_pid=$!
	timeout --kill-after=20 "$secs" "$@" >&"$fd" 2>&1 &
	BOUNDED_PID=$!
	exec {fd}>&-
	rc=0
	wait "$BOUNDED_PID" || rc=$?
	BOUNDED_PID=""
	# Let tee drain, but never hang on a stray process holding the pipe open.
	for ((i = 0; i < 100; i++)); do
		kill -0 "$tee_pid" 2>/dev/null || break
		sleep 0.1
	done
	if ((rc == 124 || rc == 137)); then
		echo "test.sh: TIMED OUT after ${secs}s: $what" | tee -a "$log"
		rc=124
	fi
	return "$rc"
}

# "${AS_PG[@]}" DIR CMD...: run CMD in DIR as the postgres user with a clean
# environment (an array, not a function, so that timeout(1) can run it).
AS_PG=(setpriv --reuid=postgres --regid=postgres --init-groups --
	env -i PATH="$PG_BIN:/usr/local/bin:/usr/bin:/bin" HOME=/var/lib/postgresql USER=postgres LOGNAME=postgres
	LANG=C.UTF-8 env -C)

# show FILE [LINES]: print a log file (its last LINES lines) to stdout.
show() {
	local file=$1 lines=${2:-$LOG_TAIL}
	[[ -f $file ]] || return 0
	printf '\n----- %s (last %d lines) -----\n' "$file" "$lines"
	tail -n "$lines" "$file"
	printf -- '----- end of %s -----\n' "$file"
}

# kill_stragglers DIR: stop every postmaster whose data directory is under DIR.
# Only servers this script started live there; each is checked by its pid file
# and working directory before it is signalled.
kill_stragglers() {
	local pidfile pid datadir i
	[[ -d $1 ]] || return 0
	while IFS= read -r -d '' pidfile; do
		datadir=$(dirname "$pidfile")
		pid=$(head -n 1 "$pidfile" 2>/dev/null || true)
		[[ $pid =~ ^[0-9]+$ ]] || continue
		[[ $(readlink "/proc/$pid/cwd" 2>/dev/null || true) == "$datadir" ]] || continue
		echo "test.sh: stopping leftover server pid $pid ($datadir)"
		kill -QUIT "$pid" 2>/dev/null || true # immediate shutdown
		for ((i = 0; i < 50; i++)); do
			[[ -d /proc/$pid ]] || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	done < <(find "$1" -name postmaster.pid -print0 2>/dev/null)
}

# tap_tally LOG FILE...: sets TALLY_OK/TALLY_BAD from a prove or pg_prove log.
# A file passed if the harness said "Result: PASS", or if it printed a result
# and did not list the file in its failure report; when there is no result line
# (killed, crashed) only files reported "ok" or "skipped" count as passed.
tap_tally() {
	local log=$1 f result=none
	shift
	TALLY_OK=0
	TALLY_BAD=0
	if grep -q '^Result: PASS' "$log"; then
		result=pass
	elif grep -q '^Result: ' "$log"; then
		result=fail
	fi
	for f in "$@"; do
		case $result in
		pass) TALLY_OK=$((TALLY_OK + 1)) ;;
		fail)
			if awk -v p="$f (Wstat" 'index($0, p) == 1 { hit = 1 } END { exit !hit }' "$log"; then
				TALLY_BAD=$((TALLY_BAD + 1))
			else
				TALLY_OK=$((TALLY_OK + 1))
			fi
			;;
		none)
			if awk -v p="$f " 'index($0, p) == 1 && / \.+ (ok|skipped)/ { hit = 1 } END { exit !hit }' "$log"; then
				TALLY_OK=$((TALLY_OK + 1))
			else
				TALLY_BAD=$((TALLY_BAD + 1))
			fi
			;;
		esac
	done
}

finish() {
	local rc=$?
	set +e
	trap - ERR
	if [[ -n $BOUNDED_PID ]]; then
		echo "test.sh: interrupted; stopping process group $BOUNDED_PID"
		kill -TERM -- "-$BOUNDED_PID" 2>/dev/null
		sleep 2
		kill -KILL -- "-$BOUNDED_PID" 2>/dev/null
	fi
	if [[ -n $PGTAP_DIR && -f $PGTAP_DIR/data/postmaster.pid ]]; then
		"${AS_PG[@]}" "$PGTAP_DIR" pg_ctl -D "$PGTAP_DIR/data" stop -m fast -w -t 30 >/dev/null 2>&1
	fi
	[[ -n $WORK ]] && kill_stragglers "$WORK"
	if ((rc == 130 || rc == 143)); then
		record test.sh 0 1 "interrupted"
	elif ((rc != 0 && FAILED == 0)); then
		record test.sh 0 1 "aborted with status $rc"
	fi
	echo
	echo "=== summary"
	printf '%s\n' "${SUMMARY[@]}"
	if [[ -n $WORK && -d $WORK ]]; then
		# Keep the tree the tests ran in when something failed (or if asked).
		if [[ ${DWARF_TEST_KEEP:-0} != 1 ]] && { ((FAILED == 0)) || [[ ! -f $WORK/src/Makefile ]]; }; then
			rm -rf "$WORK"
		else
			echo "work directory kept for inspection: $WORK"
		fi
	fi
	if ((PASSED == 0 && FAILED == 0)); then
		echo "no tests were found or run"
	fi
	echo
	echo "$PASSED passed, $FAILED failed"
	if ((FAILED == 0 && PASSED > 0)); then exit 0; fi
	exit 1
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'echo "test.sh: command failed (line $LINENO): $BASH_COMMAND"' ERR

if [[ $(id -u) -ne 0 ]]; then
	echo "test.sh: must run as root (try: sudo $0)"
	exit 1
fi

WORK=$(mktemp -d /var/tmp/dwarf-test.XXXXXX)
LOGS=$WORK/logs
SRC=$WORK/src
mkdir -p "$LOGS" "$SRC"
echo "test.sh: repository $ROOT, work directory $WORK, budget ${BUDGET}s"

# --- 1. dependencies --------------------------------------------------------
say "dependencies (scripts/deps.sh)"
if ! bounded "$LOGS/deps.log" 1200 "$ROOT/scripts/deps.sh"; then
	echo "test.sh: DEPENDENCY INSTALL FAILED; nothing else was run"
	record deps 0 1 "scripts/deps.sh failed"
	exit 1
fi

# --- 2. build and install, as root ------------------------------------------
say "build: make && make install"
if ! bounded "$LOGS/build.log" 900 make -C "$ROOT" -j"$(nproc)" PG_CONFIG="$PG_CONFIG" ||
	! bounded "$LOGS/build.log" 300 make -C "$ROOT" PG_CONFIG="$PG_CONFIG" install; then
	echo
	echo "test.sh: BUILD FAILED (compiler output above); no tests were run"
	record build 0 1 "make or make install failed"
	exit 1
fi
SUMMARY+=("build:      ok")

# The modules of src/ must not depend on each other in a circle (src/README.md).
say "module dependencies: scripts/module-deps.py"
if python3 "$ROOT/scripts/module-deps.py" >"$LOGS/module-deps.log" 2>&1; then
	tail -1 "$LOGS/module-deps.log"
	record structure 1 0
else
	cat "$LOGS/module-deps.log"
	record structure 0 1 "src/ modules depend on each other in a circle"
fi

# --- 3. a copy of the tree the postgres user owns ---------------------------
say "copying the tree to $SRC (owned by postgres)"
tar -C "$ROOT" --exclude=./.git --exclude=./tmp_check --exclude=./tmp_regress \
	--exclude=./results --exclude=./log --exclude=./regression.diffs --exclude=./regression.out \
	-cf - . | tar -C "$SRC" -xf -
chown -R postgres:postgres "$WORK"

make_var() { # the value of a variable as the Makefile defines it
	# shellcheck disable=SC2016 # $(...) is make syntax here
	make -s --no-print-directory -C "$SRC" PG_CONFIG="$PG_CONFIG" DWARF_VAR="$1" \
		--eval '.dwarf-print-var: ; @echo $($(DWARF_VAR))' .dwarf-print-var
}
read -r -a REGRESS_TESTS <<<"$(make_var REGRESS)"
shopt -s nullglob
TAP_FILES=()
for f in "$SRC"/t/*.pl; do TAP_FILES+=("t/${f##*/}"); done
PGTAP_FILES=()
for f in "$SRC"/test/pgtap/*.sql; do PGTAP_FILES+=("test/pgtap/${f##*/}"); done
shopt -u nullglob
echo "found ${#REGRESS_TESTS[@]} pg_regress tests, ${#TAP_FILES[@]} TAP files, ${#PGTAP_FILES[@]} pgTAP files"

# --- 4. pg_regress ----------------------------------------------------------
if ((${#REGRESS_TESTS[@]} > 0)); then
	say "pg_regress: make installcheck (${#REGRESS_TESTS[@]} tests)"
	# TAP_TESTS= keeps installcheck from also running prove; that is step 5.
	rc=0
	bounded "$LOGS/regress.log" 1200 "${AS_PG[@]}" "$SRC" \
		make installcheck PG_CONFIG="$PG_CONFIG" TAP_TESTS= || rc=$?
	ok=$(grep -cE '\.\.\. +ok( |$)' "$LOGS/regress.log" || true)
	bad=$(grep -cE '\.\.\. +FAILED' "$LOGS/regress.log" || true)
	missing=$((${#REGRESS_TESTS[@]} - ok - bad))
	((missing > 0)) && bad=$((bad + missing))
	note=""
	if ((rc != 0 && bad == 0)); then
		bad=1
		note="make installcheck exited with status $rc"
	elif ((missing > 0)); then
		note="$missing did not run"
	fi
	record pg_regress "$ok" "$bad" "$note"
	if ((rc != 0 || bad > 0)); then
		echo "test.sh: pg_regress FAILED"
		show "$SRC/regression.diffs" 3000
		for f in "$SRC"/log/*; do show "$f"; done # the temporary instance's logs
	fi
	kill_stragglers "$SRC/tmp_regress"
fi

# --- 5. TAP tests (PostgreSQL::Test::Cluster) -------------------------------
if ((${#TAP_FILES[@]} > 0)); then
	say "TAP: make prove_installcheck (${#TAP_FILES[@]} file(s))"
	if "${AS_PG[@]}" "$SRC" make -n prove_installcheck PG_CONFIG="$PG_CONFIG" >/dev/null 2>&1; then
		tap_cmd=(make prove_installcheck PG_CONFIG="$PG_CONFIG")
	else
		# PGXS has no prove_installcheck target of its own; its installcheck runs
		# prove when TAP_TESTS is set, so run that with no pg_regress tests.
		echo "(the Makefile has no prove_installcheck target; using installcheck REGRESS= TAP_TESTS=1)"
		tap_cmd=(make installcheck PG_CONFIG="$PG_CONFIG" REGRESS= TAP_TESTS=1)
	fi
	rc=0
	bounded "$LOGS/tap.log" 2400 "${AS_PG[@]}" "$SRC" "${tap_cmd[@]}" || rc=$?
	tap_tally "$LOGS/tap.log" "${TAP_FILES[@]}"
	note=""
	if ((rc != 0 && TALLY_BAD == 0)); then
		TALLY_BAD=1
		note="prove exited with status $rc"
	fi
	record TAP "$TALLY_OK" "$TALLY_BAD" "$note"
	if ((rc != 0 || TALLY_BAD > 0)); then
		echo "test.sh: TAP tests FAILED"
		for f in "$SRC"/tmp_check/log/*; do show "$f"; done
	fi
	kill_stragglers "$SRC/tmp_check"
fi

# --- 6. pgTAP tests against a throwaway cluster -----------------------------
if ((${#PGTAP_FILES[@]} > 0)); then
	say "pgTAP: pg_prove (${#PGTAP_FILES[@]} file(s))"
	PGTAP_DIR=$WORK/pgtap
	# The server listens only on a socket in its own directory, so no port
	# can clash with another server; the number only names the socket.
	PGTAP_PORT=55432
	mkdir -p "$PGTAP_DIR"
	chown postgres:postgres "$PGTAP_DIR"
	PSQL=(psql -X -q -v ON_ERROR_STOP=1 -h "$PGTAP_DIR" -p "$PGTAP_PORT" -U postgres)
	rc=0
	{
		bounded "$LOGS/pgtap.log" 120 "${AS_PG[@]}" "$PGTAP_DIR" \
			initdb -D "$PGTAP_DIR/data" -U postgres -A trust -E UTF8 --no-sync >/dev/null &&
			{
				cat <<-EOF
					port = $PGTAP_PORT
					listen_addresses = ''
					unix_socket_directories = '$PGTAP_DIR'
					shared_preload_libraries = 'dwarf'
				EOF
				if [[ -f $SRC/test/dwarf.conf ]]; then
					echo "include '$SRC/test/dwarf.conf'"
				fi
			} >>"$PGTAP_DIR/data/postgresql.conf" &&
			bounded "$LOGS/pgtap.log" 120 "${AS_PG[@]}" "$PGTAP_DIR" \
				pg_ctl -D "$PGTAP_DIR/data" -l "$PGTAP_DIR/server.log" -w -t 60 start &&
			bounded "$LOGS/pgtap.log" 60 "${AS_PG[@]}" "$PGTAP_DIR" \
				"${PSQL[@]}" -d postgres -c 'CREATE DATABASE dwarf_pgtap' &&
			bounded "$LOGS/pgtap.log" 60 "${AS_PG[@]}" "$PGTAP_DIR" \
				"${PSQL[@]}" -d dwarf_pgtap -c 'CREATE EXTENSION pgtap' -c 'CREATE EXTENSION dwarf'
	} || rc=$?
	if ((rc != 0)); then
		echo "test.sh: could not set up the pgTAP cluster (status $rc)"
		record pgTAP 0 "${#PGTAP_FILES[@]}" "cluster setup failed"
	else
		bounded "$LOGS/pgtap-prove.log" 900 "${AS_PG[@]}" "$SRC" \
			pg_prove -h "$PGTAP_DIR" -p "$PGTAP_PORT" -U postgres -d dwarf_pgtap \
			"${PGTAP_FILES[@]}" || rc=$?
		tap_tally "$LOGS/pgtap-prove.log" "${PGTAP_FILES[@]}"
		note=""
		if ((rc != 0 && TALLY_BAD == 0)); then
			TALLY_BAD=1
			note="pg_prove exited with status $rc"
		fi
		record pgTAP "$TALLY_OK" "$TALLY_BAD" "$note"
	fi
	if ((rc != 0)); then
		show "$PGTAP_DIR/server.log"
	fi
	"${AS_PG[@]}" "$PGTAP_DIR" pg_ctl -D "$PGTAP_DIR/data" stop -m fast -w -t 30 >/dev/null 2>&1 || true
	kill_stragglers "$PGTAP_DIR"
fi

# --- 7. the example apps (examples/run.sh: a cluster of their own) ----------
if [[ -x $SRC/examples/run.sh ]]; then
	say "examples: examples/run.sh"
	mkdir -p "$WORK/examples"
	chown postgres:postgres "$WORK/examples"
	rc=0
	bounded "$LOGS/examples.log" 600 "${AS_PG[@]}" "$SRC" examples/run.sh "$WORK/examples" || rc=$?
	if ((rc == 0)); then
		record examples 1 0
	else
		record examples 0 1 "examples/run.sh exited with status $rc"
	fi
	kill_stragglers "$WORK/examples"
fi
# --- 8. README.md: its SQL runs as written ----------------------------------
# scripts/readme-sql.py makes a cluster under $WORK/readme (kill_stragglers
# stops it if we are interrupted), runs every ```sql block of README.md in
# one psql session and names the README line of a block that failed.
say "README.md: scripts/readme-sql.py"
rc=0
bounded "$LOGS/readme.log" 600 "${AS_PG[@]}" "$SRC" \
	python3 scripts/readme-sql.py --bindir "$PG_BIN" --workdir "$WORK/readme" README.md || rc=$?
note=""
if ((rc != 0)); then
	note=$(grep -m 1 '^FAILED: ' "$LOGS/readme.log" | cut -c 9-80 || true)
	note=${note:-"scripts/readme-sql.py exited with status $rc"}
	record README 0 1 "$note"
	show "$WORK/readme/server.log" 100
else
	record README 1 0 "$(grep -m 1 '^readme: ' "$LOGS/readme.log" | cut -c 9- || true)"
fi
kill_stragglers "$WORK/readme"
