"""Summary of run.sh: per round, Vigil with BF16 interleaved (pack 0) and packed (pack 1), its
share of a plain read of the bytes it reads (bench_core --floor), and llama-bench's better of
flash attention off and on, on the same weights; then both held to AVX2."""
import json, os, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
print(open(f"{d}/cpu.txt").readline().strip(), "\n")


def vigil(name):
    lines = [l for l in open(f"{d}/{name}.jsonl") if l.startswith("{")]
    return {j["test"]: j for j in map(json.loads, lines) if j.get("test")}


def fig(j):
    return f"{j['tokens_per_s_median']:.1f} ({j['tokens_per_s_min']:.1f}–{j['tokens_per_s_max']:.1f})"


print("| round | test | interleaved | packed | packed / interleaved | llama-bench (fa) | packed / llama-bench | interleaved / llama-bench |")
print("|---|---|---|---|---|---|---|---|")
r = 1
while os.path.exists(f"{d}/llama-bf16-{r}.json"):
    a, b = vigil(f"vigil-pack0-{r}"), vigil(f"vigil-pack1-{r}")
    runs = json.load(open(f"{d}/llama-bf16-{r}.json"))
    for test, shape in (("pp512", (512, 0)), ("tg128", (0, 128))):
        best = max((x for x in runs if (x["n_prompt"], x["n_gen"]) == shape), key=lambda x: x["avg_ts"])
        va, vb = a[test]["tokens_per_s_median"], b[test]["tokens_per_s_median"]
        print(f"| {r} | {test} | {fig(a[test])} | {fig(b[test])} | ×{vb / va:.2f} | "
              f"{best['avg_ts']:.1f} ± {best['stddev_ts']:.1f} ({best['flash_attn']}) | "
              f"×{vb / best['avg_ts']:.2f} | ×{va / best['avg_ts']:.2f} |")
    r += 1

print("\n| round | layout | bytes a token | decode, share of a read of them | matmuls alone | read by job |")
print("|---|---|---|---|---|---|")
for r in range(1, r):
    for pk, name in ((0, "interleaved"), (1, "packed")):
        v = vigil(f"vigil-pack{pk}-{r}")
        f, m, j = v["tg128-floor"], v["tg128-matmuls"], v["tg128-read-by-job"]
        print(f"| {r} | {name} | {f['read_bytes_per_token'] / 1e6:.0f} MB | {f['floor_share_pct_median']:.1f} % "
              f"(read {f['read_gb_s_median']:.1f} GB/s) | {m['floor_share_pct_median']:.1f} % | {j['floor_share_pct_median']:.1f} % |")

print("\nHeld to AVX2 (VIGIL_MAX_ISA=avx2):\n")
print("| round | test | interleaved | packed | packed / interleaved |")
print("|---|---|---|---|---|")
for r in range(1, r + 1):
    if not os.path.exists(f"{d}/avx2-pack1-{r}.jsonl"):
        continue
    a, b = vigil(f"avx2-pack0-{r}"), vigil(f"avx2-pack1-{r}")
    for test in ("pp512", "tg128"):
        print(f"| {r} | {test} | {fig(a[test])} | {fig(b[test])} | ×{b[test]['tokens_per_s_median'] / a[test]['tokens_per_s_median']:.2f} |")
