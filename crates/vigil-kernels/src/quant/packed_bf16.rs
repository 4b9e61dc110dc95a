//! BF16 weights packed losslessly into 12 bits a value (`Layout::PackedBf16`): decode streams
//! every weight from DRAM each token, so a quarter fewer bytes is a quarter less time, and the
//! values, hence every result, stay the same bit for bit.
//!
//! A BF16 value's low byte (the exponent's last bit and the 7 mantissa bits) is kept as it is.
//! Its high byte (the sign and the exponent's top 7 bits) takes few values in a weight matrix:
//! 22-30 in each of the Qwen3-0.6B-shape checkpoint's matrices, and the 15 most common cover
//! all but 2 in 10,000 of its values. It is stored as a 4-bit code into the matrix's table of
//! those 15; code 15 marks an exception, listed with its byte. A SIMD kernel turns 64 codes
//! back into high bytes with one table shuffle (`pshufb`) and interleaves them with the low
//! bytes into exactly the words `interleave` would have stored.
//!
//! The bytes, each section 64-byte aligned:
//! - a 64-byte header: the table (16 bytes, entry 15 zero), then the exception count (`u32`);
//! - the groups of 8 rows in `interleave`'s order (the last padded), each a run of *pairs* of
//!   its steps (a step: 8 columns of the 8 rows). A pair is 192 bytes instead of 256: the low
//!   bytes of its first step (64), of its second (64), then 64 bytes of codes, whose low nibble
//!   is the first step's high byte at that position and whose high nibble the second's. Within
//!   a step, position `16 l + b` holds row `l + 4 (b / 8)`, column `b % 8` (`position`): the
//!   byte order in which `punpcklbw` / `punpckhbw` of the low and high bytes yield the rows'
//!   words, two rows' chunks (AVX2) or four (AVX-512) to a vector, as `interleave` lays them;
//! - the exception index: `groups + 1` `u32`s, group `g`'s exceptions at `[g]..[g + 1]`;
//! - the exceptions (`Exception`), by group, then pair, then position.
//!
//! Matrices whose columns are not a multiple of 16, or with more than one exception in
//! `MAX_EXCEPTION_SHARE` values, stay as `interleave` stores them.

use crate::storage::{AlignedBytes, Layout, WeightData};
use crate::{DType, QMatrix};
use bytemuck::{Pod, Zeroable};
use std::sync::Arc;

/// Columns a pair of steps covers.
pub const PAIR_COLS: usize = 16;
/// Bytes a pair takes: 128 low bytes, 64 of codes.
pub const PAIR_BYTES: usize = 192;
/// The code that marks an exception.
pub const ESCAPE: u8 = 15;
const HEADER: usize = 64;
/// At most one value in this many may be an exception (8 bytes each, and a pair holding one
/// takes a slower step): at this share, 6 % of a packed matrix's bytes in exceptions and 2 of 5
/// pairs patched, where the Qwen3-0.6B-shape matrices have 1 in 5,000 and 2 % patched.
const MAX_EXCEPTION_SHARE: usize = 256;

/// A value whose high byte the table lacks: its pair within the group, its position in the pair
/// (`64 * step + position`), and the byte.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq, Eq)]
pub struct Exception {
    pub pair: u32,
    pub pos: u8,
    pub byte: u8,
    _pad: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<Exception>() == 8);

/// Row (within the group) and column (within the step) of position `p` of a step.
#[inline]
pub const fn position(p: usize) -> (usize, usize) {
    (p / 16 + 4 * (p % 16 / 8), p % 8)
}

/// A packed matrix's sections, borrowed from its bytes.
#[derive(Clone, Copy)]
pub struct PackedBf16<'a> {
    pub table: [u8; 16],
    /// The groups' runs of pairs, `group_bytes` each.
    pub groups: &'a [u8],
    pub index: &'a [u32],
    pub exceptions: &'a [Exception],
    pub cols: usize,
}

impl<'a> PackedBf16<'a> {
    /// The sections of `bytes`, a packed matrix of `rows × cols`.
    pub fn new(bytes: &'a [u8], rows: usize, cols: usize) -> Self {
        let ng = rows.div_ceil(8);
        let (groups_at, index_at, exc_at, len) = sections(ng, cols, exception_count(bytes));
        PackedBf16 {
            table: bytes[..16].try_into().expect("16 bytes"),
            groups: &bytes[groups_at..index_at],
            index: bytemuck::cast_slice(&bytes[index_at..index_at + 4 * (ng + 1)]),
            exceptions: bytemuck::cast_slice(&bytes[exc_at..len]),
            cols,
        }
    }

    /// Bytes a group's run of pairs takes.
    #[inline]
    pub fn group_bytes(&self) -> usize {
        self.cols / PAIR_COLS * PAIR_BYTES
    }

    /// Group `g`'s run of pairs.
    #[inline]
    pub fn group(&self, g: usize) -> &'a [u8] {
        &self.groups[g * self.group_bytes()..(g + 1) * self.group_bytes()]
    }

    /// Group `g`'s exceptions.
    #[inline]
    pub fn group_exceptions(&self, g: usize) -> &'a [Exception] {
        &self.exceptions[self.index[g] as usize..self.index[g + 1] as usize]
    }

    /// Row `r`'s BF16 bytes, in column order (a tied embedding's lookup: only that row's
    /// values are read).
    pub fn row(&self, r: usize) -> Vec<u8> {
        let (run, exc) = (self.group(r / 8), self.group_exceptions(r / 8));
        let k = r % 8;
        // The row's 8 positions in a step (`position`'s inverse).
        let at = 16 * (k % 4) + 8 * (k / 4);
        let mut out = vec![0u8; 2 * self.cols];
        for q in 0..self.cols / PAIR_COLS {
            let pair = &run[q * PAIR_BYTES..(q + 1) * PAIR_BYTES];
            for t in 0..2 {
                for col in 0..8 {
                    let code = (pair[128 + at + col] >> (4 * t)) & 15;
                    let c = 16 * q + 8 * t + col;
                    out[2 * c] = pair[64 * t + at + col];
                    out[2 * c + 1] = self.table[code as usize];
                }
            }
        }
        for e in exc {
            let (p, t) = (e.pos as usize % 64, e.pos as usize / 64);
            if (p / 16, p % 16 / 8) == (k % 4, k / 4) {
                let c = 16 * e.pair as usize + 8 * t + p % 8;
                out[2 * c + 1] = e.byte;
            }
        }
        out
    }
}

/// Puts pair `q`'s exceptions, from `exc[e]` on, into its high bytes (`64 * step + position`);
/// returns the index of the first exception past the pair.
#[cold]
pub fn patch(high: &mut [u8; 128], exc: &[Exception], mut e: usize, q: usize) -> usize {
    while e < exc.len() && exc[e].pair as usize == q {
        high[exc[e].pos as usize] = exc[e].byte;
        e += 1;
    }
    e
}

/// The length a packed matrix of `rows × cols` takes, by its header (`bytes` at least 64).
pub fn packed_len(bytes: &[u8], rows: usize, cols: usize) -> usize {
    sections(rows.div_ceil(8), cols, exception_count(bytes)).3
}

fn exception_count(bytes: &[u8]) -> usize {
    u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes")) as usize
}

/// Where the groups, the index and the exceptions start, and the length.
fn sections(groups: usize, cols: usize, exceptions: usize) -> (usize, usize, usize, usize) {
    let index_at = HEADER + groups * cols / PAIR_COLS * PAIR_BYTES;
    let exc_at = (index_at + 4 * (groups + 1)).next_multiple_of(64);
    (HEADER, index_at, exc_at, exc_at + 8 * exceptions)
}

/// Whether `m` may be packed: BF16, columns a multiple of 16, rows as in the checkpoint.
pub fn can_pack(m: &QMatrix) -> bool {
    // BF16 dots (`VIGIL_BF16_DOTS`) read BF16 matrices as rows.
    m.dtype == DType::BF16
        && m.cols.is_multiple_of(PAIR_COLS)
        && m.layout == Layout::Rows
        && !crate::cpu::bf16_dots()
}

/// How a matrix packs: its table of the 15 most common high bytes, and how many values are
/// exceptions.
#[derive(Clone, Debug)]
pub struct PackPlan {
    table: [u8; 16],
    exceptions: usize,
}

impl PackPlan {
    /// The plan for `m` (`can_pack`), a pass counting its high bytes; `None` where they spread
    /// too widely.
    pub fn new(m: &QMatrix) -> Option<Self> {
        if !can_pack(m) || m.rows == 0 {
            return None;
        }
        let src = &m.data.bytes()[..m.rows * m.cols * 2];
        let mut count = [0usize; 256];
        for w in src.chunks_exact(2) {
            count[w[1] as usize] += 1;
        }
        let mut order: Vec<u8> = (0..=255).collect();
        order.sort_by_key(|&b| (std::cmp::Reverse(count[b as usize]), b));
        let mut table = [0u8; 16];
        table[..15].copy_from_slice(&order[..15]);
        let exceptions: usize = order[15..].iter().map(|&b| count[b as usize]).sum();
        (exceptions * MAX_EXCEPTION_SHARE <= m.rows * m.cols)
            .then_some(PackPlan { table, exceptions })
    }

    /// Each high byte's code: its place in the table, `ESCAPE` for the rest.
    fn codes(&self) -> [u8; 256] {
        let mut code = [ESCAPE; 256];
        for (c, &b) in self.table[..15].iter().enumerate() {
            code[b as usize] = c as u8;
        }
        code
    }

    /// The packed length of `m`, the matrix this plan was made for.
    pub fn len(&self, m: &QMatrix) -> usize {
        sections(m.rows.div_ceil(8), m.cols, self.exceptions).3
    }

    /// `m` packed into `out` (`len(m)` bytes, any contents): written where it will be read
    /// (the resident copy, `ModelWeights::make_resident`), never staged on the heap.
    pub fn pack_into(&self, m: &QMatrix, out: &mut [u8]) {
        let (rows, cols) = (m.rows, m.cols);
        let src = &m.data.bytes()[..rows * cols * 2];
        let ng = rows.div_ceil(8);
        let pairs = cols / PAIR_COLS;
        let (groups_at, index_at, exc_at, len) = sections(ng, cols, self.exceptions);
        assert_eq!(out.len(), len, "pack_into: output length");
        let code = self.codes();
        out[..groups_at].fill(0);
        out[..16].copy_from_slice(&self.table);
        out[16..20].copy_from_slice(&(self.exceptions as u32).to_le_bytes());
        // The index's padding up to the exceptions.
        out[index_at..exc_at].fill(0);
        let (head, exc_out) = out.split_at_mut(exc_at);
        let (groups, index) = head[groups_at..].split_at_mut(index_at - groups_at);
        let mut e = 0;
        for g in 0..ng {
            index[4 * g..4 * g + 4].copy_from_slice(&(e as u32).to_le_bytes());
            for q in 0..pairs {
                let pair = &mut groups[(g * pairs + q) * PAIR_BYTES..][..PAIR_BYTES];
                for t in 0..2 {
                    for p in 0..64 {
                        let (row, col) = position(p);
                        let r = 8 * g + row;
                        // A padding row: any code will do, its outputs are never kept.
                        let (lo, hi) = if r < rows {
                            let at = 2 * (r * cols + (2 * q + t) * 8 + col);
                            (src[at], src[at + 1])
                        } else {
                            (0, self.table[0])
                        };
                        let c = code[hi as usize];
                        if c == ESCAPE {
                            let exc = Exception {
                                pair: q as u32,
                                pos: (64 * t + p) as u8,
                                byte: hi,
                                _pad: [0; 2],
                            };
                            exc_out[8 * e..8 * e + 8].copy_from_slice(bytemuck::bytes_of(&exc));
                            e += 1;
                        }
                        pair[64 * t + p] = lo;
                        // Step 0's code in the low nibble, step 1's in the high.
                        pair[128 + p] = if t == 0 { c } else { pair[128 + p] | c << 4 };
                    }
                }
            }
        }
        assert_eq!(
            e, self.exceptions,
            "pack_into: `m` is not the plan's matrix"
        );
        index[4 * ng..4 * ng + 4].copy_from_slice(&(e as u32).to_le_bytes());
    }
}

/// The packed bytes of `m` (`can_pack`) in a new buffer, or `None` where its high bytes spread
/// too widely.
pub fn packed_bytes(m: &QMatrix) -> Option<Vec<u8>> {
    let plan = PackPlan::new(m)?;
    let mut out = vec![0u8; plan.len(m)];
    plan.pack_into(m, &mut out);
    Some(out)
}

/// `m` packed into an owned buffer (`packed_bytes`), or `None`.
pub fn packed(m: &QMatrix) -> Option<QMatrix> {
    let bytes = packed_bytes(m)?;
    Some(QMatrix {
        dtype: m.dtype,
        rows: m.rows,
        cols: m.cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
        layout: Layout::PackedBf16,
    })
}

/// Whether BF16 matrices are packed at load: unless `VIGIL_PACK_BF16=0` (read once per
/// process), which keeps them as `interleave` stores them (for comparisons).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("VIGIL_PACK_BF16").map_or(true, |v| v.trim() != "0"))
}
