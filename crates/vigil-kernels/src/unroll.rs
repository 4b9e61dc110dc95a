//! Unrolling for the kernels' step loops: a register tile whose loop body is one step of a
//! dozen FMAs spends a visible share of its time on the loop itself and its exit.

/// `f(0)`, …, `f(steps - 1)` in order, four calls a loop iteration. The order, so every
/// result's bits, is that of the plain loop. The float GEMM tiles (64 steps a column block)
/// take it: BF16 at m = 512 capped at AVX2 went from 165–170 to 177–182 GFLOP/s on two
/// threads, 85–87 to 90–93 on one. Attention's score and value-sum loops (a dozen FMAs a step
/// too) measured no faster with it (`attention_bench`, prefill of 1,024 and decode, 3 pairs).
///
/// `#[inline(always)]` and without target features of its own, so it and `f` compile into the
/// calling kernel's ISA (call it with a closure defined inside the `#[target_feature]` fn).
#[inline(always)]
pub(crate) fn unrolled4(steps: usize, mut f: impl FnMut(usize)) {
    let mut s = 0;
    while s + 4 <= steps {
        f(s);
        f(s + 1);
        f(s + 2);
        f(s + 3);
        s += 4;
    }
    while s < steps {
        f(s);
        s += 1;
    }
}
