#!/usr/bin/env bash
# Quick start: set up a virtualenv with Pora and run a local cluster in
# ./pora-cluster (nodes on 127.0.0.1:3181.., metadata in ./pora-cluster/meta.db).
# Extra arguments go to `pora cluster` (default: --nodes 3; see --help).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -e .
if [ "$#" -eq 0 ]; then
    set -- --nodes 3
fi
exec .venv/bin/pora cluster "$@"
