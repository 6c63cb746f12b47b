#!/usr/bin/env bash
# benchmarks/run.sh: the one-command benchmark run, kept at this path for the docs and the tools
# that call it. The script is benchmarks/scripts/run.sh; --help there says what it takes.
exec bash "$(dirname "$0")/scripts/run.sh" "$@"
