#!/usr/bin/env bash
# Quick start, part 2: set up a virtualenv with Pora and its test tools, then run
# the linters, the type checker and the whole test suite.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
# the metadata tests run a real ZooKeeper, and the benchmark tests a real Redis:
# Debian's packages, installed when absent
install_debian_package() {  # $1: the package, $2: a file it installs, $3: what for
    if [ ! -e "$2" ]; then
        echo "== installing Debian's $1 package ($3)"
        apt-get install -y -q "$1" >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null && apt-get install -y -q "$1" >/dev/null; }
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
