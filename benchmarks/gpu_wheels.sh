#!/bin/sh
# The wheels a GPU machine without network lacks, for benchmarks/gpu_check.py --wheels:
#   .gpu-wheels/      duckdb, nanoarrow, ijson (holoprof's dependencies) and pytest with
#                     pytest-timeout (the GPU tests; the project's pytest settings name its option)
#   .gpu-wheels-hta/  Holistic Trace Analysis and what it imports (numpy is assumed present there)
# Python 3.12, manylinux x86_64. Both folders are ignored by git; carry them to the machine.
set -e
PYTHON=${PYTHON:-python3}
PLAT="--only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64"
mkdir -p .gpu-wheels .gpu-wheels-hta
# shellcheck disable=SC2086
$PYTHON -m pip download -q $PLAT -d .gpu-wheels duckdb nanoarrow ijson pytest pytest-timeout pluggy iniconfig packaging --no-deps
# HTA's declared dependencies pull jupyterlab (too large to carry): only what it imports
# shellcheck disable=SC2086
$PYTHON -m pip download -q $PLAT -d .gpu-wheels-hta --no-deps HolisticTraceAnalysis pandas plotly narwhals \
    networkx pydot pyparsing python-dateutil six tzdata
du -sm .gpu-wheels .gpu-wheels-hta
echo "carry at most 64 MiB in all; without .gpu-wheels-hta the HTA comparison is skipped"
