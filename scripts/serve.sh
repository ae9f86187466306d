#!/usr/bin/env bash
# Quick start, part 1: set up a virtualenv with Pora and run a node on ./pora-data.
# Until the network layer lands, this runs the in-process engine tour.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -e .
exec .venv/bin/python scripts/demo_engine.py --data-dir "${PORA_DATA_DIR:-$PWD/pora-data}" "$@"
