# kiln: `make test` is what CI runs (through .ci/run); `make demo` shows the
# main job on the fixtures.
SHELL   := /bin/bash
GO      ?= go
BIN     ?= bin
# The demos' store and bundle root live outside the module: a bundle is a
# whole root filesystem, and Debian's git ships .go files, which go vet ./...
# (and so make test) would read. make clean removes DEMO.
DEMO    ?= $(HOME)/.cache/kiln/demo
STORE   ?= $(DEMO)/data
BUNDLES ?= $(DEMO)/bundles
# Benchmark size: 100M tokens by default, small in CI.
KILN_BENCH_TOKENS ?= 100000000
export KILN_BENCH_TOKENS

.PHONY: all build deps test test-gpu test-short bench bench-ci mutate demo demo-grade vet clean

all: build

# CGO_ENABLED=0: kiln-agent and kiln-sandbox-helper are bind-mounted into
# images with any libc or none, so they must be static (with cgo, net and
# os/user link the host's libc); nothing in kiln needs cgo.
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/...

# Installs versitygw and the npm readers the tests use (cached in ~/.cache/kiln).
deps:
	scripts/install-test-deps.sh

# go mod tidy -diff prints the change and fails when go.mod or go.sum need tidying.
vet:
	$(GO) mod tidy -diff
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }

# The whole suite: gpu/'s tests (test-gpu), then Go's on both store back
# ends (S3 against a real versitygw). The S3 conformance suite runs verbosely
# so the log shows which server it ran on and its known deviations; only the
# passing subtests' result lines are left out, so a failure's log lines (which
# -v prints before its --- FAIL), panics and the server's output stay.
test: deps vet test-gpu
	$(GO) test -count=1 -timeout 30m -skip '^TestS3Conformance$$' ./...
	$(GO) test -count=1 -timeout 10m -run '^TestS3Conformance$$' -v ./formats/store 2>&1 \
		| grep -vE '^ *--- PASS: ' ; test $${PIPESTATUS[0]} -eq 0

# gpu/, the PyTorch side (docs/train.md §1): installs its virtual environment
# and the Qwen3 tokenizer (cached in ~/.cache/kiln), then runs its pytest
# suite. Any pytest failure fails, exit 5 (no tests collected) included.
test-gpu:
	scripts/install-gpu-deps.sh
	cd gpu && "$$(cat $(HOME)/.cache/kiln/gpu-venv-current)/bin/python" -m pytest -q -p no:cacheprovider tests

test-short:
	$(GO) test -count=1 ./...

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./...

bench-ci: deps
	KILN_BENCH_TOKENS=2000000 $(GO) test -short -run '^$$' -bench . -benchtime 1x -timeout 10m ./...

# Mutation testing of the code whose correctness is a number (MUTATION.md):
# gremlins over stages/advantages, pipelines/plan.go and stages/train's join
# and packing, mutmut over gpu/kiln_gpu/loss.py and objectives.py, both
# pinned and cached in ~/.cache/kiln (installed when a target runs). Prints
# each target's score and its survivors, and fails when a score falls below
# its floor. MUTATE_BASE=REV runs only the targets with a file changed since
# REV; MUTATE_BUDGET=SECONDS skips the targets that would not fit in it;
# MUTATE_TARGETS picks targets (advantages plan train gpu).
mutate:
	scripts/mutate.sh $(if $(MUTATE_BASE),--changed $(MUTATE_BASE)) $(if $(MUTATE_BUDGET),--budget $(MUTATE_BUDGET)) $(MUTATE_TARGETS)

# The main job on the fixtures, on this machine, no GPU (pipelines/demo.kiln):
# installs what it needs (as make test does), builds, then kiln run does the
# whole loop: the four fixture tasks converted and their images unpacked,
# a warm start on one demonstrated fix per task (recorded through serve.py's
# forced decoding, graded, trained on), gpu/serve.py as the engine, and
# STEPS (demo.kiln's default when unset) RL steps of weights sync ->
# rollout (the shell agent, 8 samples a task, in bwrap sandboxes) -> grade
# -> advantages -> train (CPU). Ends with
# kiln status --table (one row per step and where the datasets are) and
# writes DEMO/report.html (kiln report), printing its path. A rerun runs
# nothing and says so; STEPS=N continues a finished run; DEMO=dir puts
# everything under dir (the store in dir/data). DEMO_VARS passes more
# demo.kiln variables (e.g. DEMO_VARS='ENGINE_PORT=9000 SAMPLES=2'); the
# same ones on every run, or the targets they change run again. As root:
# bwrap sandboxes.
STEPS     ?=
DEMO_VARS ?=
DEMO_KILN  = $(BIN)/kiln --store $(STORE)
DEMO_STEPS = $(if $(STEPS),STEPS=$(STEPS))
demo: deps build
	scripts/install-gpu-deps.sh
	@command -v bwrap >/dev/null || { echo 'demo: bubblewrap is missing: scripts/install-test-deps.sh installs it (as root)' >&2; exit 1; }
	@fx=$$($(GO) run ./fixtures/cmd/kiln-fixtures build --print-dir) && \
	vars="DEMO=$(abspath $(DEMO)) FIXTURES=$$fx BUNDLES=$(abspath $(BUNDLES)) GPU_DIR=$(CURDIR)/gpu \
		PYTHON=$$(cat $(HOME)/.cache/kiln/gpu-venv-current)/bin/python $(DEMO_VARS)" && \
	export PATH="$(abspath $(BIN)):$$PATH" && set -x && \
	$(DEMO_KILN) run pipelines/demo.kiln $(DEMO_STEPS) $$vars && \
	$(DEMO_KILN) status pipelines/demo.kiln --table $(DEMO_STEPS) $$vars && \
	$(DEMO_KILN) report pipelines/demo.kiln $(DEMO_STEPS) $$vars --out $(abspath $(DEMO))/report.html

# The gold patches and the empty-patch baseline of the fixture tasks,
# graded by their official tests in fresh sandboxes (the grader's check,
# beside the loop), as root (debootstrap for the fixture images, bubblewrap
# for the sandboxes): MiMo inputs to tasks, task images to rootfs bundles,
# then kiln grade. make deps installs the tools and builds the fixtures.
demo-grade: build
	@command -v bwrap >/dev/null || { echo 'demo-grade: bubblewrap is missing: run make deps first (as root)' >&2; exit 1; }
	@fx=$$($(GO) run ./fixtures/cmd/kiln-fixtures build --print-dir) && set -x && \
	$(BIN)/kiln convert mimo --store $(STORE) --data $$fx/mimo --out demo-grade/tasks && \
	$(BIN)/kiln images import --store $(STORE) --tasks demo-grade/tasks --bundles $(BUNDLES) \
		--source kiln.local/fixtures=oci:$$fx/oci --out demo-grade/images && \
	$(BIN)/kiln grade --store $(STORE) --tasks demo-grade/tasks --images demo-grade/images --bundles $(BUNDLES) \
		--patches $$fx/gold-patches.jsonl --out demo-grade/grades && \
	$(BIN)/kiln grade --store $(STORE) --tasks demo-grade/tasks --images demo-grade/images --bundles $(BUNDLES) \
		--baseline --out demo-grade/baseline && \
	$(BIN)/kiln show --store $(STORE) --rows 4 demo-grade/grades

# What build and the demos made; the cache of make deps (~/.cache/kiln) stays.
# --one-file-system: a sandbox killed mid-grading may leave a mount below.
clean:
	rm -rf $(BIN)
	rm -rf --one-file-system $(DEMO)
