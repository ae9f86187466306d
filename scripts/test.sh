#!/usr/bin/env bash
# Quick start, part 2: set up a virtualenv with Pora and its test tools, then run
# the linters, the type checker and the whole test suite.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
# the metadata tests run a real ZooKeeper: Debian's package, installed when absent
if [ ! -e /usr/share/zookeeper/bin/zkServer.sh ]; then
    echo "== installing Debian's zookeeper package (for the metadata store tests)"
    apt-get install -y -q zookeeper >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q zookeeper >/dev/null; }
fi
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -e ".[test]"
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/pytest "$@"
