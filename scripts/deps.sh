#!/bin/bash
# Install what dwarf needs to build, test, demo and benchmark on Debian 12.
# Idempotent: when every package is already installed, apt is skipped.
# Run as root:  sudo scripts/deps.sh
set -euo pipefail

PG_MAJOR=15
PG_BIN="/usr/lib/postgresql/${PG_MAJOR}/bin"
PACKAGES=(
	"postgresql-${PG_MAJOR}"
	"postgresql-server-dev-${PG_MAJOR}"
	"postgresql-${PG_MAJOR}-cron"
	"postgresql-${PG_MAJOR}-pgtap"
	libtap-parser-sourcehandler-pgtap-perl
	"postgresql-${PG_MAJOR}-plproxy"
	libipc-run-perl
	libpq-dev
	libcurl4-openssl-dev
	libcurl4
	gcc
	make
	binutils
	gdb
	python3
	python3-psycopg2
	gnuplot-nox
	jq
	prometheus-postgres-exporter
	prometheus
)

log() { printf 'deps: %s\n' "$*"; }
die() { printf 'deps: ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (try: sudo $0)"

# Packages that dpkg does not report as fully installed.
missing=()
for pkg in "${PACKAGES[@]}"; do
	status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
	[[ $status == installed ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
	log "all ${#PACKAGES[@]} packages already installed; skipping apt"
else
	log "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	apt-get install -y "${PACKAGES[@]}"
fi

[[ -x $PG_BIN/pg_config ]] || die "$PG_BIN/pg_config not found after install"
version=$("$PG_BIN/pg_config" --version)
[[ $version == "PostgreSQL ${PG_MAJOR}."* ]] || die "unexpected pg_config version: $version"

# The Debian package creates and starts a default cluster; we never use it, so
# stop it and keep it from starting at boot (it can still be started by hand).
if [[ -d /etc/postgresql/${PG_MAJOR}/main ]]; then
	pg_ctlcluster "$PG_MAJOR" main stop >/dev/null 2>&1 || true
	sed -i 's/^auto[[:space:]]*$/manual/' "/etc/postgresql/${PG_MAJOR}/main/start.conf"
	if [[ -d /run/systemd/system ]]; then
		systemctl disable --now "postgresql@${PG_MAJOR}-main" >/dev/null 2>&1 || true
	fi
	log "default cluster ${PG_MAJOR}/main stopped and set to manual start"
fi

# prometheus and prometheus-postgres-exporter come for their programs only
# (t/187 runs its own exporter and promtool): where systemd started their
# services, stop them and keep them from starting at boot.
if [[ -d /run/systemd/system ]]; then
	systemctl disable --now prometheus prometheus-postgres-exporter >/dev/null 2>&1 || true
fi

log "ok: $version ($PG_BIN)"
