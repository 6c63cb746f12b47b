# shellcheck shell=bash
# Sourced by benchmarks/run.sh and benchmarks/scaling.sh (also from a pack, where only bash,
# coreutils and /proc are sure to exist).
#
# describe_machine [LINE...]: where a run measured, one "key: value" per line, for machine.txt
# (bench_json.machine_line reads it back): the CPUs, memory, NUMA nodes, kernel, the load when
# the run starts and the date; then each LINE, which says how the programs were built (a pack
# has no compiler to ask) and in which mode they run.
describe_machine() {
  local model nodes
  model=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
  if [ -z "$model" ]; then
    model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  fi
  nodes=$(find /sys/devices/system/node -maxdepth 1 -name 'node[0-9]*' 2>/dev/null | wc -l)
  echo "cpu model: ${model:-unknown}"
  echo "cpus (nproc): $(nproc)"
  echo "numa nodes: $nodes"
  awk '/^MemTotal:/ { printf "memory: %.1f GiB (MemTotal %d kB)\n", $2 / 1048576, $2 }' \
    /proc/meminfo
  echo "kernel: $(uname -r)"
  printf '%s\n' "$@"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
}

# How this checkout's programs are built, as describe_machine's LINEs: the compiler and the
# Google Benchmark package (both Debian's; see scripts/packages.sh).
build_lines() {
  echo "compiler: $(g++ --version | head -n 1)"
  echo "google benchmark: $(dpkg-query -W -f='${Version}' libbenchmark-dev 2>/dev/null)"
}
