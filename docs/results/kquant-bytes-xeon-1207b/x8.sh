#!/bin/bash
# Q5_K interleaved at load (/tmp/mb_x8, /tmp/gb_x8: matmul_bench and gemv_bandwidth of the change):
# row-major Q5_K against q5_kx8 one thread per Gemma 3 layer from cache at 1-128 activation rows,
# natively and held to AVX2 (the x8 GEMM from 4 rows in this build; committed: from 3), then one
# activation row through 1 GiB of Qwen3-shaped matrices from DRAM on 2 threads.
# Run in its own autogroup: setsid bash -c "echo -19 > /proc/self/autogroup; bash x8.sh"
grep -m1 "model name" /proc/cpuinfo; date -u; uptime
for isa in native avx2; do for m in 1 2 3 4 8 24 128; do
reps=$(( m < 16 ? 500 : 50 ))
if [ $isa = avx2 ]; then export VIGIL_MAX_ISA=avx2; else unset VIGIL_MAX_ISA; fi
line="$isa m=$m"
for r in 1 2; do for f in q5_k q5_kx8; do line="$line $f $(/tmp/mb_x8 $m 1 $reps $f | grep layer | sed 's/.*best \([0-9.]*\) ms.*/\1/')"; done; done
echo "$line"
done; done
unset VIGIL_MAX_ISA
for r in 1 2 3; do for f in q5_k q5_kx8 q4_kx8; do echo "gemv $r $f: $(/tmp/gb_x8 $f 2 1024 5 | tail -2 | tr '\n' ' ')"; done; done
