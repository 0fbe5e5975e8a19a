#!/bin/bash
# The demo.  Run as root from anywhere:  sudo scripts/demo.sh [--fresh]
#
# Installs the dependencies, builds and installs dwarf, then runs a local
# PostgreSQL 15 server as the postgres user:
#   data       /var/tmp/dwarf-demo/data      (reused between runs)
#   socket     /var/tmp/dwarf-demo, port 5499, no TCP (listen_addresses = '')
#   log        /var/tmp/dwarf-demo/server.log
# with dwarf preloaded, creates database "demo" with the extension, and runs
# scripts/demo.sql: an order-fulfilment workflow with a fork and a join.
# The server is left running.  Exit status 0 only if the demo's flows completed.
#
# The cluster is made again from scratch when asked (--fresh), when it is
# missing or broken, or when the installed dwarf SQL script has changed since
# the cluster was made (CREATE EXTENSION IF NOT EXISTS would keep the old one).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PG_BIN=/usr/lib/postgresql/15/bin
PG_CONFIG=$PG_BIN/pg_config
export PATH="$PG_BIN:$PATH"

DEMO_DIR=/var/tmp/dwarf-demo
DATA=$DEMO_DIR/data
PORT=5499
SERVER_LOG=$DEMO_DIR/server.log
EXT_SUM_FILE=$DEMO_DIR/extension.sha256
DB=demo

say() { printf '\n=== %s\n' "$*"; }
die() {
	printf '\ndemo.sh: ERROR: %s\n' "$*"
	exit 1
}

usage() {
	echo "usage: $0 [--fresh]"
	echo "  --fresh   throw away the demo cluster in $DATA and make a new one"
}

fresh=0
for arg in "$@"; do
	case $arg in
	--fresh) fresh=1 ;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		usage
		exit 2
		;;
	esac
done

[[ $(id -u) -eq 0 ]] || die "must run as root (try: sudo $0)"

# "${AS_PG[@]}" CMD...: run CMD as the postgres user in $DEMO_DIR, clean environment.
AS_PG=(setpriv --reuid=postgres --regid=postgres --init-groups --
	env -i PATH="$PG_BIN:/usr/local/bin:/usr/bin:/bin" HOME=/var/lib/postgresql
	USER=postgres LOGNAME=postgres LANG=C.UTF-8 env -C "$DEMO_DIR")
PSQL=(psql -X -q -v ON_ERROR_STOP=1 -h "$DEMO_DIR" -p "$PORT")

show_log() {
	if [[ -f $SERVER_LOG ]]; then
		printf '\n----- last 40 lines of %s -----\n' "$SERVER_LOG"
		tail -n 40 "$SERVER_LOG"
		printf -- '----- end of %s -----\n' "$SERVER_LOG"
	fi
}

server_running() {
	"${AS_PG[@]}" pg_ctl -D "$DATA" status >/dev/null 2>&1
}

stop_server() {
	"${AS_PG[@]}" pg_ctl -D "$DATA" stop -m fast -w -t 60 >/dev/null ||
		"${AS_PG[@]}" pg_ctl -D "$DATA" stop -m immediate -w -t 30 >/dev/null
}

# A checksum of the extension files that were installed, to notice a new script.
extension_sum() {
	local ext_dir
	ext_dir="$("$PG_CONFIG" --sharedir)/extension"
	cat "$ext_dir"/dwarf.control "$ext_dir"/dwarf--*.sql | sha256sum | cut -d' ' -f1
}

init_cluster() {
	echo "demo.sh: creating a new cluster in $DATA ($1)"
	if [[ -d $DATA ]] && server_running; then
		stop_server || die "could not stop the server running on $DATA"
	fi
	rm -rf "$DATA" "$EXT_SUM_FILE"
	if [[ -f $SERVER_LOG ]]; then
		mv -f "$SERVER_LOG" "$SERVER_LOG.old"
	fi
	"${AS_PG[@]}" initdb -D "$DATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
		-E UTF8 >"$DEMO_DIR/initdb.log" 2>&1 ||
		{
			cat "$DEMO_DIR/initdb.log"
			die "initdb failed"
		}
}

# Settings live in a file of their own, rewritten every run; postgresql.conf
# includes it once.
configure_cluster() {
	cat >"$DATA/dwarf-demo.conf" <<-EOF
		# Written by scripts/demo.sh on every run; edits here are overwritten.
		port = $PORT
		listen_addresses = ''
		unix_socket_directories = '$DEMO_DIR'
		shared_preload_libraries = 'dwarf'
		dwarf.workers = 2
		max_worker_processes = 16
	EOF
	chown postgres:postgres "$DATA/dwarf-demo.conf"
	if ! grep -q "^include_if_exists = 'dwarf-demo.conf'" "$DATA/postgresql.conf"; then
		echo "include_if_exists = 'dwarf-demo.conf'" >>"$DATA/postgresql.conf"
	fi
}

# Start the server, or restart it so that a new build of dwarf is loaded.
start_server() {
	if server_running; then
		echo "demo.sh: restarting the running server so that the new build is loaded"
		"${AS_PG[@]}" pg_ctl -D "$DATA" -l "$SERVER_LOG" restart -m fast -w -t 60 >/dev/null
	else
		"${AS_PG[@]}" pg_ctl -D "$DATA" -l "$SERVER_LOG" start -w -t 60 >/dev/null
	fi
}

say "dependencies (scripts/deps.sh)"
"$ROOT/scripts/deps.sh"

say "build and install dwarf"
make -C "$ROOT" -j"$(nproc)" PG_CONFIG="$PG_CONFIG" || die "build failed (compiler output above)"
make -C "$ROOT" PG_CONFIG="$PG_CONFIG" install >/dev/null || die "make install failed"
echo "demo.sh: dwarf built and installed"

say "demo server ($DATA, socket $DEMO_DIR, port $PORT)"
mkdir -p "$DEMO_DIR"
chown postgres:postgres "$DEMO_DIR"
chmod 755 "$DEMO_DIR"
ext_sum=$(extension_sum)

made_now=1
if ((fresh)); then
	init_cluster "--fresh was given"
elif [[ ! -f $DATA/PG_VERSION ]]; then
	init_cluster "there is none yet"
elif [[ $(cat "$DATA/PG_VERSION") != 15 ]] || ! pg_controldata "$DATA" >/dev/null 2>&1; then
	init_cluster "the existing one is broken"
elif [[ -f $EXT_SUM_FILE && $(cat "$EXT_SUM_FILE") != "$ext_sum" ]]; then
	init_cluster "the installed dwarf SQL script changed since it was made"
else
	echo "demo.sh: reusing the existing cluster"
	made_now=0
fi
configure_cluster

if ! start_server; then
	show_log
	((made_now)) && die "the server did not start; see $SERVER_LOG"
	echo "demo.sh: the existing cluster did not start; making a new one"
	init_cluster "the existing one did not start"
	configure_cluster
	start_server || {
		show_log
		die "the server did not start; see $SERVER_LOG"
	}
fi
echo "demo.sh: server running (pid $(head -n 1 "$DATA/postmaster.pid"))"

say "database $DB with the dwarf extension"
if [[ -z $("${AS_PG[@]}" "${PSQL[@]}" -d postgres -tA -c "SELECT 1 FROM pg_database WHERE datname = '$DB'") ]]; then
	"${AS_PG[@]}" "${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB"
fi
"${AS_PG[@]}" "${PSQL[@]}" -d "$DB" -c 'SET client_min_messages = warning' \
	-c 'CREATE EXTENSION IF NOT EXISTS dwarf' ||
	{
		show_log
		die "CREATE EXTENSION dwarf failed"
	}
echo "$ext_sum" >"$EXT_SUM_FILE"
"${AS_PG[@]}" "${PSQL[@]}" -d "$DB" -tA -c \
	"SELECT 'dwarf ' || extversion || ' installed in database ' || current_database() FROM pg_extension WHERE extname = 'dwarf'"

say "scripts/demo.sql"
# psql reads the script from stdin: the postgres user may not be able to read
# the repository.  Every dwarf.run in it waits at most 30 s.
rc=0
timeout --kill-after=10 600 "${AS_PG[@]}" "${PSQL[@]}" -d "$DB" -f - <"$ROOT/scripts/demo.sql" || rc=$?

cat <<EOF

=== the demo server is still running
connect, as the postgres user:  psql -h $DEMO_DIR -p $PORT $DB
             or, from root:     su postgres -c 'psql -h $DEMO_DIR -p $PORT $DB'
server log:  $SERVER_LOG
stop it:     su postgres -c '$PG_BIN/pg_ctl -D $DATA stop'
EOF

if ((rc != 0)); then
	show_log
	die "scripts/demo.sql failed (psql status $rc); the server is left running for a look"
fi
echo
echo "demo.sh: demo completed"
