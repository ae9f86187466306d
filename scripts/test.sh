#!/usr/bin/env bash
# Quick start, part 2: set up a virtualenv with Pora and its test tools, then run
# the linters, the type checker and the whole test suite.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
# the metadata tests run a real ZooKeeper, and the benchmark tests a real Redis:
# Debian's packages, installed when absent
apt_lock_wait_s=${PORA_APT_LOCK_WAIT_S:-600}
apt_get() {  # apt-get "$@", waiting (up to $apt_lock_wait_s) while another apt holds its lock
    local waited=0 output
    while true; do
        if output=$(apt-get -o DPkg::Lock::Timeout=5 "$@" 2>&1 >/dev/null); then
            return 0
        fi
        case "$output" in
            *"Could not get lock"* | *"Unable to acquire"* | *"Unable to lock"*) ;;
            *) echo "$output" >&2; return 1 ;;
        esac
        if [ "$waited" -ge "$apt_lock_wait_s" ]; then
            echo "== another apt-get still holds the package lock after ${waited} s; giving up" >&2
            echo "$output" >&2
            return 1
        fi
        [ "$waited" -eq 0 ] && echo "== another apt-get holds the package lock: waiting for it (up to ${apt_lock_wait_s} s, PORA_APT_LOCK_WAIT_S)"
        sleep 5
        waited=$((waited + 10))  # the 5 s apt itself waited, and this sleep
    done
}
install_debian_package() {  # $1: the package, $2: a file it installs, $3: what for
    if [ ! -e "$2" ]; then
        echo "== installing Debian's $1 package ($3)"
        apt_get install -y -q "$1" || { apt_get update -q && apt_get install -y -q "$1"; }
    fi
}
install_debian_package zookeeper /usr/share/zookeeper/bin/zkServer.sh "the metadata store tests"
install_debian_package redis-server /usr/bin/redis-server "the benchmark's Redis peer"
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -e ".[test,spark]"
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/pytest "$@"
