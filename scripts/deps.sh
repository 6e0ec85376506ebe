#!/usr/bin/env bash
# scripts/deps.sh: everything the tests need that is not Go source, installed
# only when missing, after saying what and why. .ci/run calls it; run it alone
# (as root, or as a user with passwordless sudo) to prepare a machine.
#
#   scripts/deps.sh           check, then install what is missing
#   scripts/deps.sh --check   only report; exit 1 if anything is missing
#
# System packages come from apt with --no-upgrade --no-install-recommends,
# after a simulated install that must upgrade nothing: a test run never
# upgrades what a machine already has (the old .ci/run pulled chromium's 130
# packages and upgraded 15, systemd and perl among them). A user who cannot
# install gets the exact command to run instead, and nothing is changed.
#
# Python packages come from python/requirements-test.txt, a pip-compile lock
# with hashes, into the git-ignored .venv with pip --require-hashes (see
# docs/ci.md for how to refresh it).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=install
case "${1:-}" in
--check) mode=check ;;
"") ;;
*)
	echo "usage: scripts/deps.sh [--check]" >&2
	exit 2
	;;
esac

say() { echo "deps: $*"; }

# One line per need: a test that says it is there | apt package(s) | why.
# Keep it one line each so other suites can add theirs.
needs=(
	"command -v gcc && test -e /usr/include/stdio.h|gcc libc6-dev|cgo: the C ABI test compiles a C program, tensor/cuda's tests build a fake libcuda.so"
	"dpkg -s libfabric-dev && command -v fi_info|libfabric-dev libfabric-bin|the ofi rdma provider (go test -tags ofi) links libfabric; fi_info checks its net provider"
	"command -v dot|graphviz|topo --dot is checked by rendering it with Graphviz"
	"chrome_path|chromium-headless-shell|the dashboard browser test (chromedp); the headless shell is 19 packages, the chromium browser 130"
	"have ip && have tc|iproute2|network-namespace hosts for the multi-host fault tests (as root)"
	"command -v ucx_perftest|ucx-utils|tensorlane bench's UCX baselines (ucx-tcp beside tcp, ucx-sm beside shm) run ucx_perftest; without it those rows are skipped"
	"python3 -c 'import ensurepip, venv'|python3-venv|the Python package and Ray plug-in tests run in .venv"
)

# have finds a tool on PATH or in sbin, which a user's PATH often lacks.
have() { command -v "$1" || test -x "/usr/sbin/$1" || test -x "/sbin/$1"; }

# chrome_path prints the browser the dashboard test will use.
chrome_path() {
	local n
	for n in "${TENSORLANE_CHROMIUM:-}" chromium-headless-shell chromium headless-shell google-chrome; do
		[ -n "$n" ] && command -v "$n" && return 0
	done
	[ -x /usr/lib/chromium/chromium-headless-shell ] && echo /usr/lib/chromium/chromium-headless-shell && return 0
	return 1
}

# Go itself is not apt's to give (Debian's is older than go.mod asks): say so.
want_go=$(sed -n 's/^go \([0-9.]*\).*/\1/p' go.mod)
if ! command -v go >/dev/null; then
	say "MISSING go $want_go (go.mod): install it from https://go.dev/dl/ and put it on PATH"
	exit 1
fi
have_go=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$want_go" "$have_go" | sort -V | head -1)" != "$want_go" ]; then
	say "MISSING go >= $want_go (go.mod); this machine has $have_go"
	exit 1
fi
say "ok go $have_go (go.mod asks $want_go)"

missing=()
for n in "${needs[@]}"; do
	IFS='|' read -r test pkgs why <<<"$n"
	if eval "$test" >/dev/null 2>&1; then
		say "ok $pkgs"
	else
		say "missing $pkgs: $why"
		read -r -a ps <<<"$pkgs"
		missing+=("${ps[@]}")
	fi
done

if [ ${#missing[@]} -gt 0 ]; then
	cmd="apt-get install -y -q --no-upgrade --no-install-recommends ${missing[*]}"
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
			sudo="sudo -n"
		elif [ "$mode" = install ]; then
			say "NOT INSTALLED: not root and no passwordless sudo; as root run: apt-get update && $cmd"
			exit 1
		fi
	fi
	if [ "$mode" = check ]; then
		say "NOT INSTALLED (--check): apt-get update && $cmd"
		exit 1
	fi
	say "installing ${missing[*]} (the lines above say why), nothing upgraded:"
	$sudo apt-get update -q >/dev/null
	# Simulate first: refuse if apt wants to upgrade anything already here.
	upgrades=$($sudo apt-get install -s --no-upgrade --no-install-recommends "${missing[@]}" | sed -n 's/^Inst \([^ ]*\) \[\([^]]*\)\].*/\1 \2/p')
	if [ -n "$upgrades" ]; then
		say "REFUSED: installing ${missing[*]} would upgrade installed packages:"
		echo "$upgrades" | sed 's/^/deps:   /'
		say "install them by hand if that is acceptable: apt-get update && $cmd"
		exit 1
	fi
	say "apt will add: $($sudo apt-get install -s --no-upgrade --no-install-recommends "${missing[@]}" | sed -n 's/^Inst \([^ ]*\) .*/\1/p' | tr '\n' ' ')"
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-upgrade --no-install-recommends "${missing[@]}" >/dev/null
	say "installed ${missing[*]}"
fi

# Python: the exact versions of python/requirements-test.txt (with hashes).
# The package under test is .ci/run's to build (setuptools and wheel are
# locked too, so it builds without fetching a build backend).
lock=python/requirements-test.txt
.venv/bin/python -c '' 2>/dev/null || {
	[ "$mode" = check ] && { say "missing .venv, or its python is not usable by $(id -un) (python3 -m venv .venv; then this script)"; exit 1; }
	say "creating .venv for the Python tests"
	python3 -m venv .venv
}
# pip freeze names a package as the lock does once both are normalized.
norm() { sed 's/ *;.*//' | awk -F'==' '{n=tolower($1); gsub(/[_.]/, "-", n); print n "==" $2}'; }
want=$(grep -E '^[A-Za-z0-9]' "$lock" | sed 's/ *\\$//; s/\[[^]]*\]//' | norm | sort)
have=$(.venv/bin/python -m pip freeze --all 2>/dev/null | grep -E '^[A-Za-z0-9].*==' | norm | sort)
differ=$(comm -23 <(echo "$want") <(echo "$have"))
if [ -n "$differ" ]; then
	say "Python packages not at the lock's versions ($lock): $(echo "$differ" | tr '\n' ' ')"
	[ "$mode" = check ] && { say "NOT INSTALLED: .venv/bin/pip install --require-hashes --no-deps -r $lock"; exit 1; }
	say "installing them from $lock (pip --require-hashes: exact versions, checked hashes)"
	.venv/bin/python -m pip install -q --require-hashes --no-deps -r "$lock"
else
	say "ok Python packages at the lock's versions ($lock)"
fi
say "done"
