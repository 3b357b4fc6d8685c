#!/usr/bin/env bash
# Mutation testing of the code whose correctness is a number (make mutate;
# MUTATION.md lists each survivor and its verdict):
#
#   Go, with gremlins:  stages/advantages (the GRPO statistics),
#                       pipelines/plan.go (the planner's keys),
#                       stages/train join.go, batches.go, plan.go (join, packing)
#   Python, with mutmut: gpu/kiln_gpu/loss.py, objectives.py
#
#   scripts/mutate.sh [--changed BASE] [--budget SECONDS] [--rev REV] [TARGET...]
#
# TARGET is one of advantages, plan, train, gpu (default: all). --changed
# BASE runs only the targets with a file to mutate that differs from the git
# revision BASE (CI's use); none differing is a no-op. --budget SECONDS
# skips, with a line saying so, each target whose measured wall time
# (MINUTES below, a quiet 2-core machine) does not fit in what is left of
# SECONDS. --rev REV mutates the committed tree REV instead of the working
# tree. The testers are installed (scripts/install-mutation-deps.sh) when
# a target is to run. Each target prints its score (killed / (killed +
# lived), timed-out counting as killed) and its survivors; reports go to
# $KILN_MUTATE_OUT (default ~/.cache/kiln/mutate).
#
# Exit status: 1 when a target's score falls below its FLOOR (the score
# MUTATION.md records, less a point): a new survivor is then to be killed
# by a test or explained in MUTATION.md, with the floor moved to match.
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
# Per target: the floor of its score (%) and its wall time in minutes on a
# quiet 2-core machine (MUTATION.md, 2026-12-04/05).
declare -A FLOOR=([advantages]=94 [plan]=90 [train]=88 [gpu]=92.5)
declare -A MINUTES=([advantages]=5 [plan]=9 [train]=6 [gpu]=13)
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
budget=
rev=
targets=()
while (($#)); do
	case $1 in
	--changed) base=$2; shift 2 ;;
	--budget) budget=$2; shift 2 ;;
	--rev) rev=$2; shift 2 ;;
	-*) die "unknown flag $1" ;;
	*) targets+=("$1"); shift ;;
	esac
done
((${#targets[@]})) || targets=(advantages plan train gpu)
[[ -z $base ]] || git -C "$REPO" rev-parse --verify -q "$base^{commit}" >/dev/null ||
	die "--changed $base: not a commit of this repository (a shallow clone lacks the parent: fetch it, or name another base)"

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
	python3 - "$OUT/$name.json" "$name" $((SECONDS - t0)) "${FLOOR[$name]}" <<-'EOF' || failed+=("$name")
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
		if score < float(sys.argv[4]):
		    sys.exit(f"    {sys.argv[2]}: score {score:.1f}% is below its floor {sys.argv[4]}% (scripts/mutate.sh FLOOR): kill the new survivors or explain them in MUTATION.md")
	EOF
}

run_gpu() {
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
	python3 - "$OUT/gpu-results.txt" $((SECONDS - t0)) "${FLOOR[gpu]}" <<-'EOF' || failed+=(gpu)
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
		if score < float(sys.argv[3]):
		    sys.exit(f"    gpu: score {score:.1f}% is below its floor {sys.argv[3]}% (scripts/mutate.sh FLOOR): kill the new survivors or explain them in MUTATION.md")
	EOF
}

need git "install git"
need python3 "install python3"

# files_of TARGET: the repo-relative files TARGET mutates.
files_of() {
	local spec name dir files flags f
	if [[ $1 == gpu ]]; then
		for f in "${GPU_FILES[@]}"; do echo "gpu/$f"; done
		return
	fi
	for spec in "${GO_TARGETS[@]}"; do
		IFS='|' read -r name dir files flags <<<"$spec"
		if [[ $name == "$1" ]]; then
			for f in $files; do echo "$dir/$f"; done
		fi
	done
}

run=()
for t in "${targets[@]}"; do
	[[ -v "MINUTES[$t]" ]] || die "unknown target $t (advantages, plan, train, gpu)"
	mapfile -t want < <(files_of "$t")
	if changed "${want[@]}"; then
		run+=("$t")
	else
		log "==> $t: no file to mutate changed since $base"
	fi
done
((${#run[@]})) || exit 0
"$REPO/scripts/install-gpu-deps.sh" >/dev/null
"$REPO/scripts/install-mutation-deps.sh"

failed=()
start=$SECONDS
for t in "${run[@]}"; do
	left=$((budget - (SECONDS - start)))
	if [[ -n $budget ]] && ((MINUTES[$t] * 60 > left)); then
		log "==> $t: skipped: its ~${MINUTES[$t]} min do not fit in the ${left}s left of --budget"
		continue
	fi
	if [[ $t == gpu ]]; then
		step "mutmut gpu (${GPU_FILES[*]})" run_gpu
		continue
	fi
	[[ -d $SNAP/mod ]] || snapshot "$SNAP/mod" # gremlins copies it once per worker
	for spec in "${GO_TARGETS[@]}"; do
		IFS='|' read -r name dir files flags <<<"$spec"
		if [[ $name == "$t" ]]; then
			step "gremlins $name ($dir: $files)" run_go "$name" "$dir" "$files" "$flags"
		fi
	done
done
((${#failed[@]} == 0)) || die "below their floors: ${failed[*]} (MUTATION.md)"
