#!/usr/bin/env python3
"""The hottest loops of a profile, modelled on CPUs this machine is not: for a kernel tuned on one
x86 CPU, what `llvm-mca`'s scheduling models say the same machine code costs on another (Zen 3
when the session has an Intel Xeon, and the other way round). A model, not a measurement: it
assumes every load hits L1 and knows nothing of prefetchers, so it gives the port-bound floor of
a loop and which unit sets it, not its time.

    perf record -F 4000 -o P.data -- target/release/examples/attention_bench 2048 1 4
    scripts/model_hot_loops.py P.data target/release/examples/attention_bench [--top 4]

For each of the `--top` hottest symbols of BINARY in P.data (`--dso NAME` when the profile ran
the binary under another name) it takes the innermost loop (a backward jump) holding the most
samples, and prints the loop's share of all samples, its instructions, and per `--mcpu` model
the cycles an iteration, the busiest units and how many cycles they need an iteration. `--asm
DIR` also writes each loop's block, to edit (say, a broadcast made a load) and time again with
`llvm-mca -mcpu=znver3 DIR/LOOP.s`.

Needs LLVM 19's `llvm-mca` or later (LLVM 14's Zen 3 model takes two cycles of a pipe for a
256-bit FMA; Zen 3 issues two a cycle): `LLVM_MCA`, or Debian's `llvm-19` package
(`scripts/setup_apt_tool.sh LLVM_MCA llvm-19 /usr/lib/llvm-19/bin/llvm-mca`).
"""

import argparse
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict

LINE = re.compile(r"\s+([0-9.]+)\s+:\s+([0-9a-f]+):\s+(\S.*)")
JUMP = re.compile(r"j[a-z]+\s+([0-9a-f]+)\b")
# Resource-pressure columns that are issue units, not queues or the load/store buffers.
QUEUES = re.compile(r"LSU|Load|Store|FPSt|AGU|BRU|Divider", re.I)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw).stdout


def hottest_symbols(data, dso, top):
    out = run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol", "--stdio",
               "-g", "none", "--percent-limit", "0.5"])
    syms = []
    for line in out.splitlines():
        m = re.match(r"\s+([0-9.]+)%\s+(\S+)\s+\[\.\]\s+(.*?)\s*$", line)
        if m and m.group(2) == dso:
            # perf pads the line with its (empty) source columns.
            syms.append((float(m.group(1)), re.sub(r"(\s+-)+$", "", m.group(3))))
    return syms[:top]


def parse_annotate(text):
    """(share of the symbol's samples, address, instruction) of each line of `perf annotate
    --stdio`, in address order."""
    rows = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            rows.append((float(m.group(1)), int(m.group(2), 16), m.group(3).split("#")[0].strip()))
    return sorted(rows, key=lambda r: r[1])


def annotate(data, symbol):
    return parse_annotate(run(["perf", "annotate", "-i", data, "--stdio", "-s", symbol]))


def hottest_loop(rows):
    """(share of the symbol's samples, first address, last address) of the innermost loop (a
    backward jump's target to the jump, with no other backward jump inside) holding the most
    samples. An outer loop would mix the hot block with its setup; inlined copies of one kernel
    are separate loops, and the hottest copy stands for them."""
    loops = []
    for _, a, text in rows:
        m = JUMP.match(text)
        if m and int(m.group(1), 16) < a:
            loops.append((int(m.group(1), 16), a))
    inner = [(lo, hi) for lo, hi in loops
             if not any((l2, h2) != (lo, hi) and lo <= l2 and h2 <= hi for l2, h2 in loops)]
    best = None
    for lo, hi in inner:
        share = sum(q for q, b, _ in rows if lo <= b <= hi)
        if best is None or share > best[0]:
            best = (share, lo, hi)
    return best


def parse_objdump(text):
    """The instructions of `objdump -d --no-show-raw-insn` output, less control flow, padding
    and calls: the steady-state block `llvm-mca` times."""
    lines = []
    for line in text.splitlines():
        m = re.match(r"\s+[0-9a-f]+:\s+(\S.*)", line)
        if not m:
            continue
        ins = m.group(1).split("#")[0].strip()
        if re.match(r"(j[a-z]+|nop[a-z]*|data16|cs nop[a-z]*|call[a-z]*|ret[a-z]*)\b", ins):
            continue
        lines.append(ins)
    return lines


def loop_asm(binary, lo, hi):
    return parse_objdump(run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={lo:#x}",
                              f"--stop-address={hi + 1:#x}", binary]))


def parse_mca(out):
    """(cycles an iteration, the three busiest issue units and their cycles an iteration) from
    `llvm-mca -resource-pressure` output."""
    iters = int(re.search(r"Iterations:\s+(\d+)", out).group(1))
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / iters
    names = dict(re.findall(r"^\[([0-9.]+)\]\s+-\s+(\S+)", out, re.M))
    sect = out.split("Resource pressure per iteration:")[1].splitlines()
    cols = re.findall(r"\[([0-9.]+)\]", sect[1])
    vals = [0.0 if v == "-" else float(v) for v in sect[2].split()]
    busy = defaultdict(float)
    for c, v in zip(cols, vals):
        unit = names.get(c, c)
        if not QUEUES.search(unit):
            busy[unit] = max(busy[unit], v)
    return cycles, sorted(busy.items(), key=lambda kv: -kv[1])[:3]


def model(mca, mcpu, asm):
    return parse_mca(run([mca, f"-mcpu={mcpu}", "-iterations=300", "-timeline=false",
                          "-resource-pressure", "-instruction-info=false"],
                         input="\n".join(asm) + "\n"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("binary")
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--dso", help="the binary's name in the profile (default: BINARY's)")
    ap.add_argument("--asm", metavar="DIR",
                    help="also write each loop's block to DIR/LOOP.s, to edit and time again")
    ap.add_argument("--mcpu", default="znver3,sapphirerapids")
    args = ap.parse_args()
    mca = os.environ.get("LLVM_MCA", "/usr/lib/llvm-19/bin/llvm-mca")
    if not os.access(mca, os.X_OK):
        sys.exit(f"no llvm-mca at {mca}: set LLVM_MCA (LLVM 19 or later)")
    for share, sym in hottest_symbols(args.data, args.dso or os.path.basename(args.binary), args.top):
        rows = annotate(args.data, sym)
        loop = hottest_loop(rows)
        if loop is None:
            print(f"{share:5.1f}%  {sym}: no loop")
            continue
        in_loop, lo, hi = loop
        asm = loop_asm(args.binary, lo, hi)
        if args.asm:
            os.makedirs(args.asm, exist_ok=True)
            with open(os.path.join(args.asm, f"{lo:x}.s"), "w") as f:
                f.write("\n".join(asm) + "\n")
        ops = Counter(ins.split()[0] for ins in asm)
        common = ", ".join(f"{n} {op}" for op, n in ops.most_common(5))
        print(f"{share * in_loop / 100:5.1f}% of samples  {sym}  loop {lo:#x}-{hi:#x}: "
              f"{len(asm)} instructions ({common})")
        for mcpu in args.mcpu.split(","):
            cycles, top = model(mca, mcpu, asm)
            units = ", ".join(f"{u} {v:.1f}" for u, v in top)
            print(f"        {mcpu:>15}: {cycles:6.2f} cycles an iteration; busiest: {units}")


if __name__ == "__main__":
    main()
