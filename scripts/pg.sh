#!/bin/bash
# A PostgreSQL major that Debian 12 does not package (17, 18), built from
# Debian's own source packages into a cache outside the checkout, with the
# extensions dwarf's tests use (pg_cron, pgTAP, PL/Proxy) built for it.
#
#   scripts/pg.sh MAJOR        as root; prints the installation's bin folder
#   scripts/pg.sh 15           the system's PostgreSQL 15 (scripts/deps.sh installs it)
#
# The sources come from Debian (postgresql-17 from trixie, postgresql-18,
# pg-cron, pgtap and postgresql-plproxy from sid) through a private sources
# list and package lists under the cache, so the machine's own apt setup is
# untouched; only the build tools (bison, flex, zlib) are installed with apt.
# A second call finds the finished installation and returns at once.
#
# Environment: DWARF_PG_CACHE  the cache (default /var/cache/dwarf-pg); the
#              installation is DWARF_PG_CACHE/MAJOR, the sources and logs
#              DWARF_PG_CACHE/build-MAJOR.
set -euo pipefail

MAJOR=${1:?usage: scripts/pg.sh MAJOR (15, 17 or 18)}
CACHE=${DWARF_PG_CACHE:-/var/cache/dwarf-pg}
PREFIX=$CACHE/$MAJOR
BUILD=$CACHE/build-$MAJOR
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

log() { printf 'pg.sh %s: %s\n' "$MAJOR" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case $MAJOR in
15)
	[[ -x /usr/lib/postgresql/15/bin/pg_config ]] || die "PostgreSQL 15 is not installed: run scripts/deps.sh"
	echo /usr/lib/postgresql/15/bin
	exit 0
	;;
17 | 18) ;;
*) die "only 15, 17 and 18 are supported" ;;
esac

if [[ -f $PREFIX/.dwarf-built ]]; then
	echo "$PREFIX/bin"
	exit 0
fi
[[ $(id -u) -eq 0 ]] || die "must run as root to build (the result is cached)"

# Build tools: since 17 the tarballs carry no generated parser files.
tools=(bison flex zlib1g-dev pkg-config libipc-run-perl make gcc)
missing=()
for pkg in "${tools[@]}"; do
	[[ $(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true) == installed ]] || missing+=("$pkg")
done
if ((${#missing[@]} > 0)); then
	log "installing build tools: ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Debian's source packages, through a sources list of our own (apt checks
# the lists' signatures; each tarball is checked against its list's SHA256).
mkdir -p "$BUILD/lists/partial" "$BUILD/src"
cat >"$BUILD/sources.list" <<EOF
deb-src [signed-by=$KEYRING] http://deb.debian.org/debian trixie main
deb-src [signed-by=$KEYRING] http://deb.debian.org/debian sid main
EOF
APT=(apt-get -qq -o "Dir::Etc::sourcelist=$BUILD/sources.list" -o Dir::Etc::sourceparts=/dev/null
	-o "Dir::State::Lists=$BUILD/lists")
if [[ ! -f $BUILD/lists.done ]]; then
	log "reading Debian's source lists (trixie, sid)"
	"${APT[@]}" update
	touch "$BUILD/lists.done"
fi

# fetch PACKAGE: its upstream tarball (the newest of sid's and trixie's whose
# file the mirror has, checked against the signed source list's SHA256),
# unpacked under $BUILD/src; prints the folder, or fails.
fetch() {
	local pkg=$1 dir=$BUILD/src/$1 suite line uri name sum file
	if [[ -d $dir ]]; then
		echo "$dir"
		return 0
	fi
	for suite in sid trixie; do
		line=$("${APT[@]}" source --print-uris "$pkg/$suite" 2>/dev/null | grep "\.orig\.tar\." | head -1) || continue
		read -r uri name _ sum <<<"$line"
		uri=${uri//\'/}
		file=$BUILD/src/$name
		[[ -s $file ]] || curl -fsSL -o "$file" "$uri" 2>/dev/null || { rm -f "$file"; continue; }
		if [[ $(sha256sum "$file" | cut -d' ' -f1) != "${sum#SHA256:}" ]]; then
			log "$name does not match its checksum; skipped"
			rm -f "$file"
			continue
		fi
		mkdir -p "$dir"
		tar -C "$dir" --strip-components=1 -xf "$file"
		echo "$dir"
		return 0
	done
	return 1
}

# The server, contrib and the TAP test modules.
src=$(fetch "postgresql-$MAJOR") || die "the mirror has no source of postgresql-$MAJOR"
log "building $(basename "$src") into $PREFIX (about 10 minutes)"
(
	cd "$src"
	[[ -f config.status ]] || ./configure --prefix="$PREFIX" --enable-tap-tests --without-icu \
		--without-readline --enable-debug >"$BUILD/configure.log" 2>&1
	# a parallel flex step can race on lex.backup: a second pass finishes it
	make -j"$(nproc)" world-bin >"$BUILD/make.log" 2>&1 || make world-bin >>"$BUILD/make.log" 2>&1
	make install-world-bin >"$BUILD/install.log" 2>&1
) || die "the build failed: see $BUILD/*.log"

# The extensions dwarf's tests use, built against it.  One the mirror does
# not have is left out, and said: the tests that need it skip on this major.
: >"$PREFIX/.dwarf-extensions"
for pkg in pg-cron pgtap postgresql-plproxy; do
	if ! dir=$(fetch "$pkg"); then
		log "WARNING: the mirror has no source of $pkg; built without it"
		continue
	fi
	log "building $pkg"
	if make -C "$dir" PG_CONFIG="$PREFIX/bin/pg_config" USE_PGXS=1 >"$BUILD/$pkg.log" 2>&1 &&
		make -C "$dir" PG_CONFIG="$PREFIX/bin/pg_config" USE_PGXS=1 install >>"$BUILD/$pkg.log" 2>&1; then
		echo "$pkg" >>"$PREFIX/.dwarf-extensions"
	else
		log "WARNING: $pkg failed to build (see $BUILD/$pkg.log); built without it"
	fi
done

touch "$PREFIX/.dwarf-built"
log "ready: $("$PREFIX/bin/pg_config" --version), with: $(tr '\n' ' ' <"$PREFIX/.dwarf-extensions")"
echo "$PREFIX/bin"
