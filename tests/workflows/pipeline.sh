#!/usr/bin/env bash
# A three-stage workflow: prepare (numpy) -> sort the keys (not Python) -> train -> evaluate.
# PYTHON (default: python3) runs the Python stages; STEPS and SLEEP_PER_STEP shape the training.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-python3}"
data="${DATA_DIR:-data}"
"$py" "$here/prepare.py" "$data"
sort -n "$data/keys.txt" > "$data/keys.sorted.txt"
tar cf "$data.tar" "$data"
"$py" "$here/train.py" "$data" model.pt --steps "${STEPS:-30}" --sleep-per-step "${SLEEP_PER_STEP:-0}"
"$py" "$here/evaluate.py" "$data" model.pt
