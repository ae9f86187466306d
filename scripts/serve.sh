#!/usr/bin/env bash
# Quick start, part 1: set up a virtualenv with Pora and run a node on ./pora-data,
# listening on 127.0.0.1:3181. Extra arguments go to `pora serve` (see --help).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -e .
exec .venv/bin/pora serve --data-dir ./pora-data "$@"
