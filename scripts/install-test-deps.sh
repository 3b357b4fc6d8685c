#!/usr/bin/env bash
# Installs what kiln's test suite needs beyond Go itself, caching under
# ~/.cache/kiln/ keyed by version: a second run on the same machine is a fast
# no-op, a fresh machine (or a changed pin) rebuilds.
#
#   scripts/install-test-deps.sh
#
# Needs go, node (>= 20) and npm in PATH; apt-get (as root or via sudo) only
# when an apt package below is missing.
set -euo pipefail

CACHE="$HOME/.cache/kiln"

# --- pins -------------------------------------------------------------------

VERSITYGW_VERSION=v1.8.0

# npm packages of the interop tests (formats/records/testdata/interop), exact
# versions. apache-arrow JS has no compression codecs of its own: fzstd is
# the zstd decoder its compressionRegistry is given to read kiln's
# zstd-compressed Arrow buffers.
NPM_PACKAGES=(
	@duckdb/node-api@1.5.6-r.1
	apache-arrow@21.2.0
	fzstd@0.1.1
)

# The real coding CLIs of the client tests (internal/agent/clients), exact
# versions. Each ships its native binary as a platform optional dependency
# (@anthropic-ai/claude-code-linux-x64, @openai/codex-linux-x64, ...), which
# npm installs along with it; install_npm_clis checks that it came.
NPM_CLI_PACKAGES=(
	@anthropic-ai/claude-code@2.1.328
	@openai/codex@0.169.0
)

# Debian packages, one a line (e.g. bubblewrap).
APT_PACKAGES=(
	# fixtures: the sandbox, image unpacking, and building the base root
	# filesystem of the fixture images (fixtures.BaseRootfs).
	bubblewrap
	debootstrap
	fuse-overlayfs
	umoci
	# stages/images: kiln-images build builds Harbor tasks'
	# environment/Dockerfile images with it (chroot isolation, no daemon).
	buildah
	# stages/grade: its grading-logic tests run patch(1) and the SWE-bench
	# Pro parser (python3) on the host.
	patch
	python3
	# stages/report: the trackers' venv (scripts/install-tracker-deps.sh).
	python3-venv
	# stages/report: the report's headless-browser test drives Debian's
	# chromium over the DevTools protocol (chromedp); fonts so that its
	# screenshot (docs/report.png) has text in it.
	chromium
	fonts-dejavu-core
)

# --- helpers ----------------------------------------------------------------

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- apt --------------------------------------------------------------------

install_apt() {
	local missing=() pkg
	for pkg in "${APT_PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
			missing+=("$pkg")
		fi
	done
	if ((${#missing[@]} == 0)); then
		log "    nothing missing (${#APT_PACKAGES[@]} package(s) pinned)"
		return
	fi
	need apt-get "install ${missing[*]} by hand"
	local sudo=()
	if ((EUID != 0)); then
		need sudo "run as root, or install ${missing[*]} by hand"
		sudo=(sudo)
	fi
	log "    missing: ${missing[*]}"
	log "    apt-get update"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
	log "    apt-get install ${missing[*]}"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# --- slurm ------------------------------------------------------------------

# Debian's Slurm and munge for the one-node test cluster
# (internal/testenv/slurmtest, which starts munged, slurmctld and slurmd
# itself: no systemd units are enabled or needed). The packages come from
# the Debian archive, so apt's own cache is the cache; the marker records
# which versions the last run found, so a second run is a dpkg query.
SLURM_APT_PACKAGES=(slurm-wlm munge)

install_slurm() {
	local marker="$CACHE/slurm-installed" missing=() pkg
	for pkg in "${SLURM_APT_PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
			missing+=("$pkg")
		fi
	done
	if ((${#missing[@]} > 0)); then
		need apt-get "install ${missing[*]} by hand"
		local sudo=()
		if ((EUID != 0)); then
			need sudo "run as root, or install ${missing[*]} by hand"
			sudo=(sudo)
		fi
		log "    missing: ${missing[*]}"
		"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
		# Without recommends the daemons' plugins still come (slurm-wlm
		# depends on them); the package's own services are not started in a
		# container without systemd, and the tests do not use them.
		"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
	fi
	local bin
	for bin in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd; do
		[[ -x $bin ]] || die "$bin is missing after installing ${SLURM_APT_PACKAGES[*]}"
	done
	for bin in sbatch squeue sinfo scontrol scancel; do
		need "$bin" "slurm-wlm should have installed it"
	done
	dpkg-query -W -f='${Package} ${Version}\n' "${SLURM_APT_PACKAGES[@]}" >"$marker.tmp"
	mv "$marker.tmp" "$marker"
	log "    $(tr '\n' ' ' <"$marker")"
}

# --- versitygw --------------------------------------------------------------

install_versitygw() {
	local dir="$CACHE/versitygw-$VERSITYGW_VERSION"
	if [[ -x "$dir/versitygw" ]]; then
		log "    cached: $dir/versitygw"
		return
	fi
	need go "install Go"
	log "    go install github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION -> $dir"
	mkdir -p "$dir"
	GOBIN="$dir" go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
	[[ -x "$dir/versitygw" ]] || die "go install did not produce $dir/versitygw"
}

# --- npm --------------------------------------------------------------------

NPM_DIR=

install_npm() {
	need node "install Node.js >= 20"
	need npm "install npm"
	local node_major
	node_major=$(node -p 'process.versions.node.split(".")[0]')
	((node_major >= 20)) || die "node $(node --version) is too old: need >= 20"
	# The key covers the pins, and what the native DuckDB bindings depend on.
	local key
	key=$({
		printf '%s\n' "${NPM_PACKAGES[@]}"
		printf 'node%s %s\n' "$node_major" "$(node -p 'process.platform + "-" + process.arch')"
	} | sha256sum | cut -c1-12)
	NPM_DIR="$CACHE/npm-$key"
	local marker="$NPM_DIR/.kiln-complete"
	if [[ -f "$marker" ]]; then
		log "    cached: $NPM_DIR"
		return
	fi
	if [[ -e "$NPM_DIR" ]]; then
		log "    removing incomplete $NPM_DIR"
		rm -rf "$NPM_DIR"
	fi
	mkdir -p "$NPM_DIR"
	printf '{\n  "name": "kiln-test-deps",\n  "private": true\n}\n' >"$NPM_DIR/package.json"
	log "    npm install ${NPM_PACKAGES[*]} -> $NPM_DIR"
	(cd "$NPM_DIR" && npm install --no-audit --no-fund --update-notifier=false --save-exact "${NPM_PACKAGES[@]}")
	# Each package must load, native DuckDB bindings included.
	local spec names=()
	for spec in "${NPM_PACKAGES[@]}"; do
		names+=("${spec%@*}")
	done
	(cd "$NPM_DIR" && node -e 'for (const p of process.argv.slice(1)) require(p)' "${names[@]}") ||
		die "packages installed in $NPM_DIR do not load"
	printf '%s\n' "${NPM_PACKAGES[@]}" >"$marker"
}

# --- npm CLIs ---------------------------------------------------------------

NPM_CLIS_DIR=

install_npm_clis() {
	need node "install Node.js >= 20"
	need npm "install npm"
	# The key covers the pins and the platform (the native binaries differ).
	local key
	key=$({
		printf '%s\n' "${NPM_CLI_PACKAGES[@]}"
		printf '%s\n' "$(node -p 'process.platform + "-" + process.arch')"
	} | sha256sum | cut -c1-12)
	NPM_CLIS_DIR="$CACHE/npm-clis-$key"
	local marker="$NPM_CLIS_DIR/.kiln-complete"
	if [[ -f "$marker" ]]; then
		log "    cached: $NPM_CLIS_DIR"
		return
	fi
	if [[ -e "$NPM_CLIS_DIR" ]]; then
		log "    removing incomplete $NPM_CLIS_DIR"
		rm -rf "$NPM_CLIS_DIR"
	fi
	mkdir -p "$NPM_CLIS_DIR"
	printf '{\n  "name": "kiln-test-clis",\n  "private": true\n}\n' >"$NPM_CLIS_DIR/package.json"
	log "    npm install ${NPM_CLI_PACKAGES[*]} -> $NPM_CLIS_DIR"
	# --include=optional: the platform binaries are optional dependencies.
	(cd "$NPM_CLIS_DIR" && npm install --no-audit --no-fund --update-notifier=false --save-exact \
		--include=optional "${NPM_CLI_PACKAGES[@]}")
	# Each CLI must run (its native binary present) and report its pinned version.
	local bin want got
	for bin in claude codex; do
		[[ -x "$NPM_CLIS_DIR/node_modules/.bin/$bin" ]] || die "npm did not install $NPM_CLIS_DIR/node_modules/.bin/$bin"
	done
	for spec in "${NPM_CLI_PACKAGES[@]}"; do
		want=${spec##*@}
		case $spec in
		@anthropic-ai/claude-code@*) bin=claude ;;
		@openai/codex@*) bin=codex ;;
		*) continue ;;
		esac
		got=$(DISABLE_AUTOUPDATER=1 HOME="$NPM_CLIS_DIR" "$NPM_CLIS_DIR/node_modules/.bin/$bin" --version 2>&1) ||
			die "$bin --version failed (native binary missing?): $got"
		[[ $got == *"$want"* ]] || die "$bin --version says '$got', want $want"
		log "    $bin --version: $got"
	done
	rm -rf "$NPM_CLIS_DIR/.claude" "$NPM_CLIS_DIR/.claude.json" "$NPM_CLIS_DIR/.codex"
	printf '%s\n' "${NPM_CLI_PACKAGES[@]}" >"$marker"
}

# --- fixtures ---------------------------------------------------------------

# Builds kiln's test fixtures once (fixtures.Load): the debootstrap base root
# filesystem ($CACHE/rootfs-<key>, needs root; mirror from
# $KILN_DEBIAN_MIRROR) and the fixture set ($CACHE/fixtures-<key>: task
# repositories, OCI layout, MiMo/SWE-bench inputs). Both are keyed by
# version in the fixtures package, so this is a no-op once built.
install_fixtures() {
	need go "install Go"
	local repo sudo=()
	repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	if ((EUID != 0)); then
		need sudo "run as root: debootstrap needs it"
		sudo=(sudo env "PATH=$PATH" "HOME=$HOME")
	fi
	(cd "$repo" && "${sudo[@]}" go run ./fixtures/cmd/kiln-fixtures build >/dev/null) ||
		die "building the fixtures failed (see above)"
	log "    fixtures built under $CACHE"
}

# --- main -------------------------------------------------------------------

main() {
	local start elapsed
	start=$(now_us)
	mkdir -p "$CACHE"
	step "apt packages" install_apt
	step "slurm and munge" install_slurm
	step "versitygw $VERSITYGW_VERSION" install_versitygw
	step "npm packages" install_npm
	step "npm CLIs" install_npm_clis
	step "fixtures" install_fixtures
	# stages/report's trackers (wandb, tensorboard): their own venv.
	"$(dirname "${BASH_SOURCE[0]}")/install-tracker-deps.sh"
	printf '%s\n' "$NPM_DIR" >"$CACHE/npm-current.tmp"
	mv "$CACHE/npm-current.tmp" "$CACHE/npm-current"
	printf '%s\n' "$NPM_CLIS_DIR" >"$CACHE/npm-clis-current.tmp"
	mv "$CACHE/npm-clis-current.tmp" "$CACHE/npm-clis-current"
	elapsed=$(($(now_us) - start))
	printf 'done in %d.%03ds\n' $((elapsed / 1000000)) $((elapsed % 1000000 / 1000))
	log "npm directory: $NPM_DIR (recorded in $CACHE/npm-current)"
	log "npm CLIs directory: $NPM_CLIS_DIR (recorded in $CACHE/npm-clis-current)"
}

main "$@"
