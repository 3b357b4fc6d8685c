#!/usr/bin/env bash
# Installs the mutation testers `make mutate` runs (scripts/mutate.sh),
# cached under ~/.cache/kiln/ keyed by version: a second run on the same
# machine is a fast no-op, a changed pin installs anew.
#
#   scripts/install-mutation-deps.sh
#
# - gremlins (Go): ~/.cache/kiln/gremlins-<version>/gremlins, by go install;
# - mutmut (Python): a virtual environment ~/.cache/kiln/mutmut-<key> (key:
#   the pin and the gpu venv it extends), recorded in
#   ~/.cache/kiln/mutmut-venv-current. It sees gpu/'s environment (torch,
#   pytest) through a .pth file rather than being installed into it, so the
#   gpu venv stays exactly its lock.
#
# Needs go, and gpu/'s environment (scripts/install-gpu-deps.sh runs first).
set -euo pipefail

CACHE="$HOME/.cache/kiln"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# --- pins -------------------------------------------------------------------

GREMLINS_VERSION=v0.6.0
MUTMUT_VERSION=3.8.1

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_gremlins() {
	local dir="$CACHE/gremlins-$GREMLINS_VERSION"
	if [[ -x "$dir/gremlins" ]]; then
		log "    cached: $dir/gremlins"
		return
	fi
	need go "install Go"
	log "    go install github.com/go-gremlins/gremlins/cmd/gremlins@$GREMLINS_VERSION -> $dir"
	mkdir -p "$dir"
	GOBIN="$dir" go install "github.com/go-gremlins/gremlins/cmd/gremlins@$GREMLINS_VERSION"
	[[ -x "$dir/gremlins" ]] || die "go install did not produce $dir/gremlins"
}

install_mutmut() {
	local gpu_venv
	gpu_venv=$(cat "$CACHE/gpu-venv-current" 2>/dev/null) || die "no gpu venv: run scripts/install-gpu-deps.sh first"
	[[ -x "$gpu_venv/bin/python" ]] || die "$gpu_venv/bin/python is missing: run scripts/install-gpu-deps.sh"
	local key venv
	key=$(printf '%s\n' "mutmut==$MUTMUT_VERSION" "$gpu_venv" | sha256sum | cut -c1-12)
	venv="$CACHE/mutmut-$key"
	if [[ -f "$venv/.kiln-complete" ]]; then
		log "    cached: $venv"
	else
		[[ -e $venv ]] && { log "    removing incomplete $venv"; rm -rf "$venv"; }
		# The gpu venv's own interpreter makes the base, so the two share a
		# Python version and the .pth below is valid.
		"$gpu_venv/bin/python" -m venv "$venv"
		local gpu_site site
		gpu_site=$("$gpu_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
		site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
		printf '%s\n' "$gpu_site" >"$site/kiln-gpu-venv.pth"
		log "    pip install mutmut==$MUTMUT_VERSION -> $venv"
		"$venv/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off \
			"mutmut==$MUTMUT_VERSION" >"$venv/pip-install.log" 2>&1 || {
			tail -n 30 "$venv/pip-install.log" >&2
			die "pip install mutmut==$MUTMUT_VERSION failed (log: $venv/pip-install.log)"
		}
		"$venv/bin/python" -c 'import torch, pytest, mutmut' || die "$venv cannot import torch, pytest and mutmut"
		date -u +%FT%TZ >"$venv/.kiln-complete"
	fi
	printf '%s\n' "$venv" >"$CACHE/mutmut-venv-current.tmp"
	mv "$CACHE/mutmut-venv-current.tmp" "$CACHE/mutmut-venv-current"
}

main() {
	mkdir -p "$CACHE"
	step "gremlins $GREMLINS_VERSION" install_gremlins
	step "mutmut $MUTMUT_VERSION" install_mutmut
	printf '%s\n' "$CACHE/gremlins-$GREMLINS_VERSION/gremlins" >"$CACHE/gremlins-current.tmp"
	mv "$CACHE/gremlins-current.tmp" "$CACHE/gremlins-current"
}

main "$@"
