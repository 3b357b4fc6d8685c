# Helpers the install scripts share; sourced, never run. die prefixes its
# message with the sourcing script's name.

log() { printf '%s\n' "$*"; }
die() {
	printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2
	exit 1
}
now_us() { local t=$EPOCHREALTIME; printf '%s' "${t//[!0-9]/}"; }

# step NAME FUNCTION: runs FUNCTION, then prints how long it took.
step() {
	local name=$1 start elapsed
	shift
	log "==> $name"
	start=$(now_us)
	"$@"
	elapsed=$(($(now_us) - start))
	printf '    %s: %d.%03ds\n' "$name" $((elapsed / 1000000)) $((elapsed % 1000000 / 1000))
}

need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not in PATH ($2)"; }
