# warden — see README.md. Every target works on a fresh machine with Go.
GO       ?= go
POLICY   ?= policies.example.yaml
DATA_DIR ?= ./data
FUZZTIME ?= 10s
# Packages with fuzz targets and the targets to run briefly on every test run.
FUZZ     := ./policy:FuzzParse ./scheduler:FuzzParseSubmit ./scheduler:FuzzKeyExpr ./scheduler:FuzzLookupJSON ./scheduler/store:FuzzDecode

.PHONY: run build test test-unit fuzz lint vet fmt-check bench-limits bench-proxy bench-scheduler bench-bridge bench-rls clean

run:
	$(GO) run ./cmd/warden run --policy $(POLICY) --data-dir $(DATA_DIR)

build:
	$(GO) build -o bin/warden ./cmd/warden

# The whole suite: static checks, unit and end-to-end tests with the race
# detector, then every fuzz target for $(FUZZTIME).
test: lint test-unit fuzz

test-unit:
	$(GO) test -race -count=1 -timeout 30m ./...

fuzz:
	@set -e; for spec in $(FUZZ); do \
		pkg=$${spec%%:*}; target=$${spec##*:}; \
		echo "fuzz $$pkg $$target for $(FUZZTIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$target$$" -fuzztime=$(FUZZTIME) $$pkg; \
	done

lint: vet fmt-check

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench-limits:
	@mkdir -p bench/out
	$(GO) test -run='^$$' -bench=. -benchmem -cpu=1,2 -count=1 ./bench/limits/ | tee bench/out/limits.txt
	$(GO) run ./bench/cmd/benchtab limits < bench/out/limits.txt

# The run scheduler: admissions/s, durable submits/s, submit→start and
# freed-slot→delivery latency, RSS with 1,000,000 queued runs, each beside a
# buffered Go channel feeding the same worker (see bench/cmd/schedbench).
bench-scheduler:
	@mkdir -p bench/out
	$(GO) build -o bench/out/schedbench ./bench/cmd/schedbench
	bench/out/schedbench | tee bench/out/scheduler.txt

clean:
	rm -rf bin bench/out
