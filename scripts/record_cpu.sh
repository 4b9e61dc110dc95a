#!/bin/bash
# Writes what a benchmark ran on into FILE: the CPU model and flags (first two lines, which
# check_cpu_bars.py and the summaries read), the caps both engines ran under, and the
# topology (threads per core, caches, clock) that tells two hosts of the same model apart,
# e.g. whether the two vCPUs of a 2-core VM are SMT siblings of one core.
# Usage: scripts/record_cpu.sh FILE [LLAMACPP_BIN]
set -u
f=${1:?usage: record_cpu.sh FILE [LLAMACPP_BIN]}
grep -m1 'model name' /proc/cpuinfo > "$f"
grep -m1 '^flags' /proc/cpuinfo >> "$f"
echo "VIGIL_MAX_ISA=${VIGIL_MAX_ISA:-(none)} LLAMACPP_BIN=${2:-(none)}" >> "$f"
lscpu 2>/dev/null | grep -E '^(Thread|Core|Socket|L1d|L2|L3|CPU max MHz|CPU MHz|NUMA node\(s\))' >> "$f"
