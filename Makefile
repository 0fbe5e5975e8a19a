# dwarf: PGXS build.  `make && make install`, then the tests:
#   make installcheck        pg_regress against a temporary instance that preloads dwarf
#   make prove_installcheck  TAP tests (crash, restart) in t/
MODULE_big = dwarf
OBJS = \
	src/dwarf.o \
	src/globals.o \
	src/shmem.o \
	src/launcher.o \
	src/worker.o \
	src/intake.o \
	src/request.o \
	src/rows.o \
	src/partitions.o \
	src/step.o \
	src/session.o \
	src/lend.o \
	src/runner.o \
	src/crashes.o \
	src/queue.o \
	src/store.o \
	src/sleepers.o \
	src/graph.o \
	src/limits.o \
	src/names.o \
	src/flowrun.o \
	src/merge.o \
	src/archive.o \
	src/api.o \
	src/ops.o \
	src/control.o \
	src/flows.o \
	src/json.o \
	src/restore.o \
	src/offers.o \
	src/external.o \
	src/http.o \
	src/url.o \
	src/stats.o \
	src/compat.o

# HTTP tasks' calls (src/http.c): Debian's libcurl4-openssl-dev to build, libcurl4 to run.
# HTTP tasks' process loads libcurl itself (http.c, LoadCurl): linked here,
# every server process would map it.

# Two extensions: dwarf on each shard (or single server), dwarf_router on a
# router database that sends calls to the shards with PL/Proxy (pure SQL).
EXTENSION = dwarf dwarf_router
DATA = sql/dwarf--0.1.sql sql/dwarf_router--0.1.sql
PGFILEDESC = "dwarf - durable workflows inside PostgreSQL"

REGRESS = $(patsubst sql/%.sql,%,$(filter-out sql/dwarf--%.sql sql/dwarf_router--%.sql,$(sort $(wildcard sql/*.sql))))
REGRESS_OPTS = --temp-config=$(srcdir)/test/dwarf.conf --temp-instance=$(CURDIR)/tmp_regress --load-extension=dwarf
TAP_TESTS = $(if $(wildcard t/*.pl),1)

PG_CFLAGS = -fvisibility=hidden -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers -Wno-sign-compare
EXTRA_CLEAN = tmp_regress bench/dwarf-bench bench/external-bench

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The load drivers are plain libpq clients: dwarf-bench for flows of SQL
# tasks, external-bench for external tasks (dwarf.claim and dwarf.complete).
all: bench/dwarf-bench bench/external-bench

bench/dwarf-bench bench/external-bench: bench/%: bench/%.c
	$(CC) -O2 -Wall -Wextra -Werror -I$(shell $(PG_CONFIG) --includedir) -o $@ $< \
		-L$(shell $(PG_CONFIG) --libdir) -lpq -lm -lpthread

# `make prove_installcheck` runs the TAP tests alone (PGXS runs them after
# pg_regress in `make installcheck`).
.PHONY: prove_installcheck
prove_installcheck:
	$(prove_installcheck)

# Every source file includes the shared header: rebuild them all when it changes.
$(OBJS): src/dwarf.h src/shmem.h src/graph.h src/flowrun.h src/worker.h src/flows.h src/json.h src/request.h src/rows.h src/limits.h src/stats.h src/partitions.h src/compat.h
