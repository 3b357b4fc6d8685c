#!/usr/bin/env bash
# Mutation testing of the code whose correctness is a number (make mutate;
# MUTATION.md lists each survivor and its verdict):
#
#   Go, with gremlins:  stages/advantages (the GRPO statistics),
#                       pipelines/plan.go (the planner's keys),
#                       stages/train join.go, batches.go, plan.go (join, packing)
#   Python, with mutmut: gpu/kiln_gpu/loss.py, objectives.py
#
#   scripts/mutate.sh [--changed BASE] [--rev REV] [TARGET...]
#
# TARGET is one of advantages, plan, train, gpu (default: all). --changed
# BASE runs only the targets with a file to mutate that differs from the git
# revision BASE (CI's use); none differing is a no-op. --rev REV mutates
# the committed tree REV instead of the working tree. Each target prints its
# score (killed / (killed + lived), timed-out counting as killed) and its
# survivors; reports go to $KILN_MUTATE_OUT (default ~/.cache/kiln/mutate).
#
# Bounds: every Go mutant runs only its package's fast unit tests (GOFLAGS
# -run/-skip below, never the end-to-end tests that start a trainer), with
# gremlins' timeout at 5x the coverage run; mutmut runs only the tests that
# reach the mutated function. Both run two at a time (KILN_MUTATE_WORKERS).
# The Go side mutates a copy of the module, the Python side a copy of gpu/,
# so the working tree is never touched.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="$HOME/.cache/kiln"
OUT=${KILN_MUTATE_OUT:-$CACHE/mutate}
WORKERS=${KILN_MUTATE_WORKERS:-2}
. "$REPO/scripts/lib.sh"

# name | package dir | files to mutate (space-separated) | go test flags
GO_TARGETS=(
	"advantages|stages/advantages|compute.go estimate.go select.go stats.go|-run=^(TestCompute|TestFanout|TestGroupAdvantages|TestInfraMapping|TestPassAtK|TestSummarize|TestStatsGolden|TestSelect|TestProperties|TestDifferential|TestRunEndToEnd)"
	"plan|pipelines|plan.go|-skip=^(TestKillAndResume|TestLockLost|TestDemo|TestDemoKillAndResume)$"
	"train|stages/train|join.go batches.go plan.go|-run=^(TestPlanGolden|TestRepeatEpochs|TestSegmentOfTopP|TestMicroBatchTensors|TestJoin|TestSchedule|TestPack|TestDenominators|TestLayoutInvariants|TestContextCheck|TestDryRun|TestBadInputs)"
)
GPU_FILES=(kiln_gpu/loss.py kiln_gpu/objectives.py)
# test_train.py's other tests train the tiny model end to end (minutes
# each on two cores): only its objective tests run.
GPU_TESTS=(
	tests/test_loss.py
	tests/test_policy_logprobs.py
	tests/test_micro_batch_loss.py
	tests/test_train.py::test_score_centering_expected_gradient_is_zero
	tests/test_train.py::test_score_centering_matching_distributions_zero_correction
	tests/test_train.py::test_differential_against_reference
	tests/test_train.py::test_micro_batch_loss_applies_a_non_default_correction_high
)

base=
rev=
targets=()
while (($#)); do
	case $1 in
	--changed) base=$2; shift 2 ;;
	--rev) rev=$2; shift 2 ;;
	-*) die "unknown flag $1" ;;
	*) targets+=("$1"); shift ;;
	esac
done
((${#targets[@]})) || targets=(advantages plan train gpu)

# changed FILE...: whether any FILE (repo-relative) differs from $base.
changed() {
	[[ -z $base ]] && return 0
	[[ -n $(git -C "$REPO" diff --name-only "$base" -- "$@") ]]
}

mkdir -p "$OUT"
SNAP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-mutate.XXXXXX")
trap 'rm -rf "$SNAP"' EXIT

# snapshot DIR: the tree to mutate (the working tree's tracked and
# unignored files, or --rev's commit) into DIR.
snapshot() {
	mkdir -p "$1"
	if [[ -n $rev ]]; then
		git -C "$REPO" archive "$rev" | tar -C "$1" -xf -
	else
		(cd "$REPO" && git ls-files -z --cached --others --exclude-standard |
			tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -C "$1" -xf -
	fi
}

run_go() {
	local name=$1 dir=$2 files=$3 flags=$4
	local f want=()
	for f in $files; do want+=("$dir/$f"); done
	if ! changed "${want[@]}"; then
		log "    $name: no file to mutate changed since $base"
		return
	fi
	local gremlins
	[[ -f $CACHE/gremlins-current ]] ||
		die "gremlins is not installed: run scripts/install-mutation-deps.sh (make mutate does)"
	gremlins=$(cat "$CACHE/gremlins-current")
	# gremlins' exclusions are paths relative to the package directory;
	# Go's regexp has no negative look-ahead, so every other non-test file
	# under it is excluded by name.
	local ex=() rel
	while IFS= read -r rel; do
		[[ " $files " == *" $rel "* ]] && continue
		ex+=(-E "^${rel//./\\.}\$")
	done < <(cd "$SNAP/mod/$dir" && find . -name '*.go' ! -name '*_test.go' | sed 's|^\./||')
	local t0=$SECONDS
	(cd "$SNAP/mod" && GOFLAGS="${GOFLAGS:-} $flags" "$gremlins" unleash --workers "$WORKERS" \
		--timeout-coefficient 5 "${ex[@]}" -o "$OUT/$name.json" "./$dir") >"$OUT/$name.log" 2>&1 ||
		{ tail -20 "$OUT/$name.log" >&2; die "gremlins failed on $dir (log: $OUT/$name.log)"; }
	python3 - "$OUT/$name.json" "$name" $((SECONDS - t0)) <<-'EOF'
		import json, sys
		r = json.load(open(sys.argv[1]))
		st = {}
		surv = []
		for f in r.get("files", []):
		    for m in f.get("mutations", []):
		        st[m["status"]] = st.get(m["status"], 0) + 1
		        if m["status"] == "LIVED":
		            surv.append(f'{f["file_name"]}:{m["line"]}:{m["column"]} {m["type"]}')
		k, l, t = st.get("KILLED", 0), st.get("LIVED", 0), st.get("TIMED OUT", 0)
		score = 100 * (k + t) / max(k + t + l, 1)
		print(f"    {sys.argv[2]}: score {score:.1f}% ({k} killed, {t} timed out, {l} lived, "
		      f"{st.get('NOT COVERED', 0)} not covered, {st.get('NOT VIABLE', 0)} not viable) in {sys.argv[3]}s")
		for s in surv:
		    print(f"      LIVED {s}")
	EOF
}

run_gpu() {
	local want=() f
	for f in "${GPU_FILES[@]}"; do want+=("gpu/$f"); done
	if ! changed "${want[@]}"; then
		log "    gpu: no file to mutate changed since $base"
		return
	fi
	local venv
	[[ -f $CACHE/mutmut-venv-current ]] ||
		die "mutmut is not installed: run scripts/install-mutation-deps.sh (make mutate does)"
	venv=$(cat "$CACHE/mutmut-venv-current")
	[[ -d $SNAP/mod ]] || snapshot "$SNAP/mod"
	mkdir -p "$SNAP/gpu"
	cp -a "$SNAP/mod/gpu/kiln_gpu" "$SNAP/mod/gpu/tests" "$SNAP/mod/gpu/pyproject.toml" "$SNAP/gpu/"
	# pyproject.toml has no [tool.mutmut], so mutmut reads setup.cfg. torch
	# is not fork-safe after use: workers fork from a clean fork server.
	{
		printf '[mutmut]\nsource_paths = kiln_gpu\n'
		printf 'only_mutate =\n'
		for f in "${GPU_FILES[@]}"; do printf '    %s\n' "$f"; done
		printf 'pytest_add_cli_args_test_selection =\n'
		for f in "${GPU_TESTS[@]}"; do printf '    %s\n' "$f"; done
		printf 'pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -q\n'
		printf 'process_isolation = forkserver\n'
		printf 'use_git_change_detection = false\n'
	} >"$SNAP/gpu/setup.cfg"
	local t0=$SECONDS
	(cd "$SNAP/gpu" && CI= "$venv/bin/mutmut" run --max-children "$WORKERS") >"$OUT/gpu.log" 2>&1 ||
		{ tail -30 "$OUT/gpu.log" >&2; die "mutmut failed (log: $OUT/gpu.log)"; }
	(cd "$SNAP/gpu" && "$venv/bin/mutmut" results --all true) >"$OUT/gpu-results.txt" 2>&1 || true
	python3 - "$OUT/gpu-results.txt" $((SECONDS - t0)) <<-'EOF'
		import collections, sys
		st = collections.Counter()
		surv = []
		for line in open(sys.argv[1]):
		    if ":" not in line:
		        continue
		    name, _, status = line.strip().rpartition(": ")
		    st[status] += 1
		    if status == "survived":
		        surv.append(name)
		k, l, t = st["killed"], st["survived"], st["timeout"]
		score = 100 * (k + t) / max(k + t + l, 1)
		print(f"    gpu: score {score:.1f}% ({k} killed, {t} timed out, {l} survived, "
		      f"{st['no tests']} no tests) in {sys.argv[2]}s")
		for s in surv:
		    print(f"      LIVED {s}")
	EOF
}

need git "install git"
need python3 "install python3"
snapped=
for t in "${targets[@]}"; do
	case $t in
	advantages | plan | train)
		if [[ -z $snapped ]]; then
			# gremlins copies what it is pointed at once per worker.
			snapshot "$SNAP/mod"
			snapped=1
		fi
		for spec in "${GO_TARGETS[@]}"; do
			IFS='|' read -r name dir files flags <<<"$spec"
			[[ $name == "$t" ]] && step "gremlins $name ($dir: $files)" run_go "$name" "$dir" "$files" "$flags"
		done
		;;
	gpu) step "mutmut gpu (${GPU_FILES[*]})" run_gpu ;;
	*) die "unknown target $t (advantages, plan, train, gpu)" ;;
	esac
done
