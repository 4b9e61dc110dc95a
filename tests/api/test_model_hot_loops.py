"""`scripts/model_hot_loops.py`, which models a profile's hottest loops on other CPUs: its parsing
of `perf annotate`, `objdump` and `llvm-mca` output, on real output of each committed under
`tests/fixtures/mca/` (the AVX2 prefill score loop of `attention_bench`, and `llvm-mca` 19's
Zen 3 model of it). Running `perf` and `llvm-mca` themselves is left to the script's users."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "mca"

spec = importlib.util.spec_from_file_location("model_hot_loops", REPO / "scripts" / "model_hot_loops.py")
mhl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mhl)


def test_the_innermost_hot_loop_is_taken_not_the_one_around_it():
    rows = mhl.parse_annotate((FIXTURES / "scores_annotate.txt").read_text())
    assert rows == sorted(rows, key=lambda r: r[1])
    # Two backward jumps: the score loop over dimensions (0x789d0-0x78a4f) and the loop over
    # key groups around it (a `jmp` back to 0x78839). The inner one holds nearly every sample.
    share, lo, hi = mhl.hottest_loop(rows)
    assert (lo, hi) == (0x789D0, 0x78A4F)
    inside = [p for p, a, _ in rows if lo <= a <= hi]
    assert share == sum(inside) and 95.0 < share <= 100.0
    # The annotation's source lines and `#` comments are not instructions.
    assert all(not text.startswith(":") and "#" not in text for _, _, text in rows)


def test_no_loop_without_a_backward_jump():
    rows = [(50.0, 0x10, "vfmadd231ps %ymm0,%ymm1,%ymm2"), (50.0, 0x20, "jne    30 <f+0x30>")]
    assert mhl.hottest_loop(rows) is None


def test_objdump_keeps_the_block_llvm_mca_times():
    asm = mhl.parse_objdump((FIXTURES / "scores_objdump.txt").read_text())
    # The fixture's 30 lines less a `nopl`, the `jne` closing the loop and the `jmp` after it.
    assert len(asm) == 27
    assert asm[0] == "mov    0x40(%rsp),%r9"
    assert sum(a.startswith("vfmadd231ps") for a in asm) == 12
    assert not any(a.startswith(("j", "nop")) for a in asm)


def test_mca_cycles_and_busiest_units():
    cycles, busiest = mhl.parse_mca((FIXTURES / "scores_znver3_mca.txt").read_text())
    # 1,817 cycles for 300 iterations of 12 FMAs: the FMA pipes' 6 a loop, nearly.
    assert abs(cycles - 1817 / 300) < 1e-9
    units = dict(busiest)
    assert len(busiest) == 3 and set(units) <= {"Zn3FP0", "Zn3FP1", "Zn3FP2", "Zn3FP3"}
    assert all(5.9 < v <= 6.1 for v in units.values())
    # Load/store queues and address units are not issue units.
    assert not any(mhl.QUEUES.search(u) for u in units)
