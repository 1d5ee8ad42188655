# warden — see README.md. Every target works on a fresh machine with Go.
GO       ?= go
POLICY   ?= policies.example.yaml
DATA_DIR ?= ./data
FUZZTIME ?= 10s
# What `warden version` prints: the commit when built from a git checkout
# (machines that set GOFLAGS=-buildvcs=false get no VCS stamp from go build).
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS  := -X main.version=$(VERSION)
# Packages with fuzz targets and the targets to run briefly on every test run.
FUZZ     := ./policy:FuzzParse ./proxy/bridge:FuzzParseStartup ./proxy/bridge:FuzzScanners ./proxy/rls:FuzzShouldRateLimit \
            ./scheduler:FuzzParseSubmit ./governor/retry:FuzzRetryAfter ./scheduler:FuzzKeyExpr ./scheduler:FuzzLookupJSON ./scheduler/store:FuzzDecode \
            ./proxy/httpwire:FuzzScanRequestHeaders ./proxy/httpwire:FuzzStripRequest ./proxy/httpwire:FuzzAddDate \
            ./internal/hostport:FuzzAuthority ./proxy/httpwire:FuzzSplitAbsoluteForm ./proxy/httpwire:FuzzMaxForwards \
            ./proxy/httpwire:FuzzForwardedFor \
            ./connpool:FuzzChunkedReader ./internal/jsonstr:FuzzAppend ./proxy/grpcegress:FuzzServiceOf ./proxy/grpcegress:FuzzGrpcTimeout \
            ./scheduler/store/pgstore:FuzzFirstSchema ./policy:FuzzNodeBound ./proxy/listener:FuzzHeadScan ./governor/tenant:FuzzParseCursor

.PHONY: run build test test-unit fuzz lint vet fmt-check bench-limits bench-proxy bench-scheduler bench-bridge bench-rls chaos chaos-short chaos-deps clean

run:
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/warden run --policy $(POLICY) --data-dir $(DATA_DIR)

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/warden ./cmd/warden

# The whole suite: static checks, unit and end-to-end tests with the race
# detector, then every fuzz target for $(FUZZTIME).
test: lint test-unit fuzz

test-unit:
	$(GO) test -race -count=1 -timeout 30m ./...

# Go 1.26's fuzz coordinator can report a bare "context deadline exceeded"
# when -fuzztime ends while a worker is busy (golang/go#75804, fixed in
# 1.27): that run found nothing, so it is run again (at most three runs in
# all); a failing input written to testdata/fuzz, or any other failure,
# fails the target.
fuzz:
	@set -e; for spec in $(FUZZ); do \
		pkg=$${spec%%:*}; target=$${spec##*:}; \
		for try in 1 2 3; do \
			echo "fuzz $$pkg $$target for $(FUZZTIME)"; \
			if $(GO) test -run='^$$' -fuzz="^$$target$$" -fuzztime=$(FUZZTIME) $$pkg > .fuzz.out 2>&1; then cat .fuzz.out; break; fi; \
			cat .fuzz.out; \
			if [ $$try != 3 ] && grep -q 'context deadline exceeded' .fuzz.out && ! grep -q 'Failing input written' .fuzz.out; then \
				echo "fuzz $$target: the coordinator's deadline race (golang/go#75804), no failing input: running it again"; \
			else rm -f .fuzz.out; exit 1; fi; \
		done; \
	done; rm -f .fuzz.out

lint: vet fmt-check

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench-limits:
	@mkdir -p bench/out
	$(GO) test -run='^$$' -bench=. -benchmem -cpu=1,2 -count=3 ./bench/limits/ | tee bench/out/limits.txt
	$(GO) run ./bench/cmd/benchtab limits < bench/out/limits.txt

# pgbench directly, through a warden bridge and through PgBouncer (session
# mode, same pool size), side by side. BENCH_T=5 BENCH_RUNS=1 for a quick look.
bench-bridge:
	@command -v pgbench >/dev/null || (apt-get update -qq && apt-get install -y postgresql-client)
	@command -v pgbouncer >/dev/null || (apt-get update -qq && apt-get install -y pgbouncer)
	@mkdir -p bench/out
	$(GO) test -run='^$$' -bench=RoundTrip -benchmem -cpu=1,2 -count=1 ./proxy/bridge/ | tee bench/out/bridge-go.txt
	$(GO) run ./bench/cmd/benchbridge | tee bench/out/bridge.txt

# Shared windows through Redis and the Envoy RLS (needs redis-server and
# redis-benchmark: apt-get install redis-server redis-tools), beside
# envoyproxy/ratelimit's own server, built once per RATELIMIT_VERSION from
# its Go module into bench/out (its own module, not warden's go.mod; a
# failed build leaves build.log there and its rows say so). REDIS_URL
# picks the server; BENCH_FLAGS passes e.g. -duration 10s -rounds 5.
REDIS_URL ?= redis://127.0.0.1:6379/0
RATELIMIT_VERSION ?= v1.4.1-0.20260122083618-3fb702589d36
RATELIMIT_DIR = bench/out/ratelimit/$(RATELIMIT_VERSION)
bench-rls:
	@mkdir -p $(RATELIMIT_DIR)
	@test -x $(RATELIMIT_DIR)/service_cmd || GOBIN=$(CURDIR)/$(RATELIMIT_DIR) GOFLAGS=-mod=mod timeout 900 \
		$(GO) install github.com/envoyproxy/ratelimit/src/service_cmd@$(RATELIMIT_VERSION) >$(RATELIMIT_DIR)/build.log 2>&1 \
		|| echo "bench-rls: envoyproxy/ratelimit did not build, see $(RATELIMIT_DIR)/build.log"
	$(GO) build -o bench/out/rlsbench ./bench/cmd/rlsbench
	bench/out/rlsbench -redis $(REDIS_URL) -ratelimit $(RATELIMIT_DIR)/service_cmd $(BENCH_FLAGS) | tee bench/out/rls.txt

# The run scheduler: admissions/s, durable submits/s, submit→start and
# freed-slot→delivery latency, RSS with 1,000,000 queued runs, each beside a
# buffered Go channel feeding the same worker (see bench/cmd/schedbench).
bench-scheduler:
	@mkdir -p bench/out
	$(GO) build -o bench/out/schedbench ./bench/cmd/schedbench
	bench/out/schedbench | tee bench/out/scheduler.txt

# The data plane against nginx and HAProxy (installed when missing), plus
# the allocations per proxied request from the handler benchmarks.
bench-proxy: build
	@mkdir -p bench/out
	@command -v nginx >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y nginx >/dev/null || echo "nginx missing: its row stays empty"
	@command -v haproxy >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y haproxy >/dev/null || echo "haproxy missing: its row stays empty"
	$(GO) test -run='^$$' -bench='IngressHandler|EgressHandler' -benchmem -count=1 ./proxy/ingress ./proxy/egress | tee bench/out/proxy-allocs.txt
	$(GO) run ./bench/cmd/benchproxy -warden bin/warden -out bench/out

# The reliability figures (bench/README.md): the built binary through
# faults and hostile load, with a private redis-server and a private
# Postgres (initdb) of its own; prints one table (bench/out/chaos.txt) and
# exits 1 naming any invariant that failed. CHAOS_FLAGS passes flags, e.g.
# -run 'redis|breaker'; chaos-short is the few minutes .ci/run spends.
CHAOS_FLAGS ?=
chaos: build chaos-deps
	@mkdir -p bench/out
	$(GO) build -o bench/out/chaos ./bench/cmd/chaos
	bench/out/chaos -warden bin/warden -out bench/out $(CHAOS_FLAGS)

chaos-short:
	$(MAKE) chaos CHAOS_FLAGS="-short $(CHAOS_FLAGS)"

chaos-deps:
	@command -v redis-server >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null)

clean:
	rm -rf bin bench/out
