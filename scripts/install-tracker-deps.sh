#!/usr/bin/env bash
# Installs the trackers' Python environment (docs/report.md §5): a virtual
# environment with wandb and tensorboard, every package pinned in
# scripts/trackers-requirements.lock. kiln report --wandb writes its offline
# run with it; stages/report's tests read the TensorBoard event files and
# the wandb run back with those packages' own readers.
#
#   scripts/install-tracker-deps.sh
#
# Cached under ~/.cache/kiln/trackers-venv-<key> (key: the lock file and the
# interpreter's version), recorded in ~/.cache/kiln/trackers-venv-current: a
# second run is a fast no-op, a changed pin installs anew. Separate from the
# gpu venv (gpu/requirements.lock), which it leaves alone.
# scripts/install-test-deps.sh runs it. Needs python3 (>= 3.9) with venv.
set -euo pipefail

CACHE="$HOME/.cache/kiln"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK="$REPO/scripts/trackers-requirements.lock"

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_trackers() {
	need python3 "install python3 (Debian: apt-get install python3 python3-venv)"
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' ||
		die "python3 $(python3 --version 2>&1) is too old: wandb and tensorboard need >= 3.9"
	local key venv
	key=$({
		cat "$LOCK"
		python3 -c 'import platform, sys; print(sys.version, platform.machine())'
	} | sha256sum | cut -c1-12)
	venv="$CACHE/trackers-venv-$key"
	if [[ -f "$venv/.kiln-complete" ]]; then
		log "    cached: $venv"
	else
		[[ -e $venv ]] && { log "    removing incomplete $venv"; rm -rf "$venv"; }
		python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
		log "    pip install -r scripts/trackers-requirements.lock -> $venv"
		"$venv/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off \
			-r "$LOCK" >"$venv/pip-install.log" 2>&1 || {
			tail -n 30 "$venv/pip-install.log" >&2
			die "pip install -r $LOCK failed (log: $venv/pip-install.log)"
		}
		"$venv/bin/python" -c 'import wandb, tensorboard.backend.event_processing.event_accumulator' ||
			die "$venv cannot import wandb and tensorboard's event_accumulator"
		[[ -x "$venv/bin/wandb" ]] || die "pip did not install $venv/bin/wandb"
		date -u +%FT%TZ >"$venv/.kiln-complete"
	fi
	log "    $("$venv/bin/python" -c 'import wandb, tensorboard; print("wandb", wandb.__version__, "tensorboard", tensorboard.__version__)')"
	printf '%s\n' "$venv" >"$CACHE/trackers-venv-current.tmp"
	mv "$CACHE/trackers-venv-current.tmp" "$CACHE/trackers-venv-current"
}

main() {
	mkdir -p "$CACHE"
	step "trackers venv (wandb, tensorboard)" install_trackers
}

main "$@"
