#!/usr/bin/env bash
# benchmarks/scaling.sh: the many-core scaling run (and `--pack` for a machine without a
# toolchain), kept at this path for the docs and the tools that call it. The script is
# benchmarks/scripts/scaling.sh; --help there says what it takes.
exec bash "$(dirname "$0")/scripts/scaling.sh" "$@"
