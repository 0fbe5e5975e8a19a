#!/bin/bash
# Runs the example apps against a throwaway PostgreSQL cluster that preloads
# dwarf:  examples/run.sh [DIR]
#
# As root it runs itself again as the postgres user (PostgreSQL refuses to
# run as root); the repository must then be readable by postgres.  The
# cluster lives in DIR (default: a new /var/tmp/dwarf-examples.XXXXXX) and
# listens only on a unix socket there, so no port can clash.  It creates the
# extension, loads examples/orders/schema.sql, runs examples/orders/app.py,
# and stops the cluster; DIR is removed when it made DIR and all passed.
#
# Environment: PG_BIN   PostgreSQL's programs (default /usr/lib/postgresql/15/bin)
#              PYTHON   the Python with psycopg2 (default /usr/bin/python3)
#              EXAMPLES_TIMEOUT  seconds the app may take (default 300)
# Exit status 0 only when the app's checks all passed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PYTHON=${PYTHON:-/usr/bin/python3}
APP_TIMEOUT=${EXAMPLES_TIMEOUT:-300}

if [[ $(id -u) -eq 0 ]]; then
	if [[ -n ${1:-} ]]; then
		mkdir -p "$1"
		chown postgres:postgres "$1"
	fi
	exec setpriv --reuid=postgres --regid=postgres --init-groups -- \
		env -i PATH="$PG_BIN:/usr/local/bin:/usr/bin:/bin" HOME=/var/lib/postgresql \
		USER=postgres LOGNAME=postgres LANG=C.UTF-8 PG_BIN="$PG_BIN" PYTHON="$PYTHON" \
		EXAMPLES_TIMEOUT="$APP_TIMEOUT" "$HERE/run.sh" "$@"
fi

made_dir=0
if [[ -n ${1:-} ]]; then
	DIR=$1
	mkdir -p "$DIR"
else
	DIR=$(mktemp -d /var/tmp/dwarf-examples.XXXXXX)
	made_dir=1
fi
DIR=$(cd "$DIR" && pwd)
DATA=$DIR/data
PORT=55499 # names the socket only: listen_addresses is empty
PSQL=("$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DIR" -p "$PORT" -U postgres)

# Stop the cluster whatever happened; keep DIR (and show the server's log)
# when something failed.
finish() {
	local rc=$?
	set +e
	if [[ -f $DATA/postmaster.pid ]]; then
		"$PG_BIN/pg_ctl" -D "$DATA" stop -m fast -w -t 30 >/dev/null 2>&1 ||
			"$PG_BIN/pg_ctl" -D "$DATA" stop -m immediate -w -t 30 >/dev/null 2>&1
	fi
	if ((rc == 0)); then
		((made_dir)) && rm -rf "$DIR"
		echo "examples: passed"
	else
		if [[ -f $DIR/server.log ]]; then
			echo "----- $DIR/server.log (last 100 lines) -----"
			tail -n 100 "$DIR/server.log"
		fi
		echo "examples: FAILED (status $rc); cluster kept in $DIR"
	fi
	exit "$rc"
}
trap finish EXIT

echo "examples: cluster in $DATA (socket $DIR, port $PORT)"
rm -rf "$DATA"
timeout 120 "$PG_BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-sync >"$DIR/initdb.log" 2>&1 ||
	{
		cat "$DIR/initdb.log"
		exit 1
	}
cat >>"$DATA/postgresql.conf" <<-EOF
	port = $PORT
	listen_addresses = ''
	unix_socket_directories = '$DIR'
	shared_preload_libraries = 'dwarf'
	max_connections = 60
	fsync = off
EOF
"$PG_BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 start >/dev/null
timeout 60 "${PSQL[@]}" -d postgres -c 'CREATE DATABASE shop'
timeout 60 "${PSQL[@]}" -d shop -c 'CREATE EXTENSION dwarf'
timeout 60 "${PSQL[@]}" -d shop -f "$HERE/orders/schema.sql" >/dev/null

echo "examples: orders/app.py"
timeout --kill-after=10 "$APP_TIMEOUT" "$PYTHON" "$HERE/orders/app.py" \
	"host=$DIR port=$PORT user=postgres dbname=shop application_name=orders-example"
