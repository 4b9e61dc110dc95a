# The float GEMM's activation chunk (CHUNK_BYTES, 768 KiB) swept with temporary.patch applied (an env
# override, not kept): matmul_bench 512 2 6 bf16p held to AVX2 and native, 3 rounds alternated.
# Run as: setsid bash -c 'echo -19 > /proc/self/autogroup; bash run.sh > out.txt 2>&1'
cd /work/main
for r in 1 2 3; do
for isa in avx2 native; do
for k in 768 384 256; do
if [ $isa = avx2 ]; then e="VIGIL_MAX_ISA=avx2"; else e=""; fi
echo "r$r $isa chunk_kib=$k $(env $e TMP_CHUNK_KIB=$k target/release/examples/matmul_bench 512 2 6 bf16p 2>&1 | grep -E 'x|layer' | tr '\n' ' ')"
done; done; done
