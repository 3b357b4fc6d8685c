# kiln: `make test` is what CI runs (through .ci/run); `make demo` shows the
# main job on the fixtures.
SHELL   := /bin/bash
GO      ?= go
BIN     ?= bin
STORE   ?= ./data
# Benchmark size: 100M tokens by default, small in CI.
KILN_BENCH_TOKENS ?= 100000000
export KILN_BENCH_TOKENS

.PHONY: all build deps test test-short bench bench-ci demo vet clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# Installs versitygw and the npm readers the tests use (cached in ~/.cache/kiln).
deps:
	scripts/install-test-deps.sh

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }

# The whole suite, both store back ends (S3 against a real versitygw). The S3
# conformance suite runs verbosely so the log shows which server it ran on.
test: deps vet
	$(GO) test -count=1 -timeout 30m -skip '^TestS3Conformance$$' ./...
	$(GO) test -count=1 -timeout 10m -run '^TestS3Conformance$$' -v ./formats/store \
		| grep -E '^(=== RUN|--- FAIL|ok|FAIL|PASS)|versitygw v|known deviation' ; test $${PIPESTATUS[0]} -eq 0

test-short:
	$(GO) test -count=1 ./...

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./...

bench-ci: deps
	KILN_BENCH_TOKENS=2000000 $(GO) test -short -run '^$$' -bench . -benchtime 1x -timeout 10m ./...

# The main job, as far as it is built: import the MiMo smoke tasks into a
# store, inspect them, export them back for the reference stack, and show
# what gc would collect.
demo: build
	$(BIN)/kiln import tasks --store $(STORE) --out tasks/mimo-smoke fixtures/tasks/mimo-smoke.jsonl
	$(BIN)/kiln ls --store $(STORE)
	$(BIN)/kiln show --store $(STORE) --rows 1 tasks/mimo-smoke
	$(BIN)/kiln log --store $(STORE) tasks/mimo-smoke
	$(BIN)/kiln export --store $(STORE) --out $(STORE)/mimo-smoke.export.jsonl tasks/mimo-smoke
	$(BIN)/kiln gc --store $(STORE) --dry-run

clean:
	rm -rf $(BIN)
