#!/usr/bin/env bash
# adapter-ab.sh: the adapter load benchmark (BenchmarkAdapterLoad) for two
# versions of the code, alternating, with the median and range of each
# figure per case — how to tell a change of a few percent from the noise of
# a shared machine, where one binary's CPU per turn can move by a fifth
# within minutes (BENCHMARKS.md, "Adapter under load").
#
#   bench/adapter-ab.sh [-n ROUNDS] [-b BENCH_REGEX] [-s SKIP_REGEX] OLD [NEW]
#
# OLD and NEW are git revisions; NEW defaults to the working tree as it is.
# Each round runs OLD then NEW. Defaults: 3 rounds, the 64- and 256-session
# cases ('AdapterLoad/^sessions=(64|256)$', skipping the 100 turns/s case).
# The realistic-engine case (engine=200ms-2s/...: added latency and CPU
# share) runs with -b 'AdapterLoad/^engine='. Revisions from before the
# agent runtime moved under internal/ (the package was stages/rollout/adapter)
# build too. Raw lines go to $TMPDIR/adapter-ab.*/runs.txt; the summary to
# stdout.
set -euo pipefail

rounds=3
bench='AdapterLoad/^sessions=(64|256)$'
skip='AdapterLoad/sessions=64/rate'
while getopts "n:b:s:" opt; do
	case $opt in
	n) rounds=$OPTARG ;;
	b) bench=$OPTARG ;;
	s) skip=$OPTARG ;;
	*) sed -n '2,18p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	sed -n '2,18p' "$0" >&2
	exit 2
fi
old=$1
new=${2:-}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d "${TMPDIR:-/tmp}/adapter-ab.XXXXXX")
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true' EXIT

build() { # build REV|"" OUT
	local dir=$root
	if [ -n "$1" ]; then
		git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true
		git -C "$root" worktree add --detach "$work/tree" "$1" >/dev/null
		dir=$work/tree
	fi
	local pkg=$dir/internal/agent/adapter
	[ -d "$pkg" ] || pkg=$dir/stages/rollout/adapter # before the move
	(cd "$pkg" && go test -c -o "$2" .)
}
echo "building $old and ${new:-the working tree} in $work" >&2
build "$old" "$work/old.test"
build "$new" "$work/new.test"

# The binaries need no files of their package: run them from the root.
adapterdir=$root
for r in $(seq "$rounds"); do
	for v in old new; do
		echo "round $r/$rounds: $v" >&2
		(cd "$adapterdir" && "$work/$v.test" -test.run '^$' -test.bench "$bench" -test.skip "$skip" -test.benchtime 1x) |
			grep '^Benchmark' | sed "s/^/$v /" >>"$work/runs.txt"
	done
done

# Per case and figure: median (min–max) for old and new, and new/old of
# the medians.
awk '
{
	v = $1; name = $2; sub(/^BenchmarkAdapterLoad\//, "", name); sub(/-[0-9]+$/, "", name)
	for (i = 4; i < NF; i += 2) {
		unit = $(i + 1)
		if (unit !~ /^(adapter-cpu|relay@rate-cpu|relay-cpu|kiln-cpu|gc-cpu|harness-cpu)-µs\/turn$|^heap-B\/session@|^turns\/s$|^added-p(50|99)-ms$|^cpu-%-of-(core|turn)$/) continue
		key = name SUBSEP unit
		if (!(key in seen)) { seen[key] = 1; order[++n] = key }
		vals[key, v, ++cnt[key, v]] = $i
	}
}
# Figures under 10 (milliseconds, percentages) keep three significant digits.
function f(x) { return (x < 10 && x > -10) ? sprintf("%.3g", x) : sprintf("%.0f", x) }
function med(key, v,    k, m, i, j, t, a) {
	m = cnt[key, v]
	for (i = 1; i <= m; i++) a[i] = vals[key, v, i] + 0
	for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	lo = a[1]; hi = a[m]
	return (m % 2) ? a[(m+1)/2] : (a[m/2] + a[m/2+1]) / 2
}
END {
	printf "%-22s %-26s %-26s %-26s %s\n", "case", "figure", "old: median (range)", "new: median (range)", "new/old"
	for (k = 1; k <= n; k++) {
		split(order[k], p, SUBSEP)
		# A figure only one version reports is shown as "-" for the other.
		mo = med(order[k], "old"); o = cnt[order[k], "old"] ? sprintf("%s (%s–%s)", f(mo), f(lo), f(hi)) : "-"
		mn = med(order[k], "new"); w = cnt[order[k], "new"] ? sprintf("%s (%s–%s)", f(mn), f(lo), f(hi)) : "-"
		r = (mo > 0 && cnt[order[k], "new"]) ? sprintf("%.2f", mn / mo) : "-"
		printf "%-22s %-26s %-26s %-26s %s\n", p[1], p[2], o, w, r
	}
}' "$work/runs.txt"
