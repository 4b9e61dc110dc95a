//! The KV tensors: per layer, `num_blocks × block_size` slots of `kv_heads × head_dim` keys and
//! values, keys d-major and values head-major within each block (the layout attention reads,
//! `vigil_kernels::attention::{key_index, value_index}`). Which slots belong to whom is the engine's
//! `BlockPool`'s business, not this file's. Rows leave and enter this file (`read_rows`,
//! `write_rows`) in slot order whatever the layout, so saved sessions do not depend on it.
//! Each tensor is a [`KvBuf`]: memory is taken as rows are written, and the rows of blocks
//! that no sliding-window layer will read again are given back (`release_blocks`).

use half::f16;
use vigil_kernels::attention::{key_index, value_pieces};

use crate::kv_buf::{page_size, KvBuf};

/// Element type of the cache. F16 halves memory; F32 is exact (used by numeric tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F16,
    F32,
}

impl KvDtype {
    pub fn size(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }
}

pub(crate) enum KvLayers {
    F16(Vec<[KvBuf<f16>; 2]>),
    F32(Vec<[KvBuf<f32>; 2]>),
}

pub struct KvCache {
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_dim: usize,
    pub head_dim: usize,
    pub(crate) layers: KvLayers,
}

impl KvCache {
    pub fn new(
        num_layers: usize,
        (kv_heads, head_dim): (usize, usize),
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Self {
        let kv_dim = kv_heads * head_dim;
        let n = num_blocks * block_size * kv_dim;
        // Zeroed mappings: the OS maps pages on first write, so resident memory grows with
        // the blocks used, not the pool's size.
        let layers = match dtype {
            KvDtype::F16 => KvLayers::F16(
                (0..num_layers)
                    .map(|_| [KvBuf::zeroed(n), KvBuf::zeroed(n)])
                    .collect(),
            ),
            KvDtype::F32 => KvLayers::F32(
                (0..num_layers)
                    .map(|_| [KvBuf::zeroed(n), KvBuf::zeroed(n)])
                    .collect(),
            ),
        };
        KvCache {
            num_blocks,
            block_size,
            kv_dim,
            head_dim,
            layers,
        }
    }

    /// Bytes one token occupies across all layers (K and V).
    pub fn bytes_per_token(num_layers: usize, kv_dim: usize, dtype: KvDtype) -> usize {
        num_layers * 2 * kv_dim * dtype.size()
    }

    pub fn dtype(&self) -> KvDtype {
        match self.layers {
            KvLayers::F16(_) => KvDtype::F16,
            KvLayers::F32(_) => KvDtype::F32,
        }
    }

    pub fn num_layers(&self) -> usize {
        match &self.layers {
            KvLayers::F16(l) => l.len(),
            KvLayers::F32(l) => l.len(),
        }
    }

    /// Map the memory of every layer but `skip` (the sliding-window layers, whose pages are
    /// given back as the window slides) now: see `KvBuf::prefault`. Returns the bytes mapped.
    pub fn prefault(&self, skip: &[usize]) -> usize {
        fn each<E: bytemuck::Pod>(bufs: &[[KvBuf<E>; 2]], skip: &[usize]) -> usize {
            (bufs.iter().enumerate())
                .filter(|(l, _)| !skip.contains(l))
                .flat_map(|(_, kv)| kv.iter())
                .map(KvBuf::prefault)
                .sum()
        }
        match &self.layers {
            KvLayers::F16(bufs) => each(bufs, skip),
            KvLayers::F32(bufs) => each(bufs, skip),
        }
    }

    /// Ask for small pages for `layers`' buffers (the sliding-window layers, whose pages
    /// `release_blocks` gives back): see `KvBuf::keep_small_pages`.
    pub fn keep_small_pages(&self, layers: &[usize]) {
        fn each<E: bytemuck::Pod>(bufs: &[[KvBuf<E>; 2]], layers: &[usize]) {
            for kv in layers.iter().filter_map(|&l| bufs.get(l)) {
                kv.iter().for_each(KvBuf::keep_small_pages);
            }
        }
        match &self.layers {
            KvLayers::F16(bufs) => each(bufs, layers),
            KvLayers::F32(bufs) => each(bufs, layers),
        }
    }

    /// Give back the memory of `blocks` in `layers` (the sliding-window layers): every page
    /// lying wholly inside blocks that `released` says no one will read there again. A page
    /// shared with a block still in use stays, so with blocks smaller than a page memory goes
    /// back once all the blocks on a page are released. Released rows read as zeros.
    pub fn release_blocks(
        &mut self,
        layers: &[usize],
        blocks: &[u32],
        released: impl Fn(u32) -> bool,
    ) {
        fn each<E: bytemuck::Pod>(
            bufs: &mut [[KvBuf<E>; 2]],
            layers: &[usize],
            runs: &[(usize, usize)],
        ) {
            for &l in layers {
                let Some(kv) = bufs.get_mut(l) else { continue };
                for buf in kv.iter_mut() {
                    for &(lo, hi) in runs {
                        buf.release(lo..hi);
                    }
                }
            }
        }
        let block_elems = self.block_size * self.kv_dim;
        let block_bytes = block_elems * self.dtype().size();
        let (Some(page), false) = (page_size(), block_bytes == 0) else {
            return;
        };
        // The pages touching a block reach at most this many blocks to either side.
        let reach = page.div_ceil(block_bytes) as u32;
        let last = self.num_blocks as u32;
        let runs: Vec<(usize, usize)> = (blocks.iter().copied())
            .filter(|&b| b < last && released(b))
            .map(|b| {
                let lo = (b.saturating_sub(reach)..b)
                    .rev()
                    .take_while(|&x| released(x))
                    .last();
                let hi = (b + 1..(b + 1 + reach).min(last))
                    .take_while(|&x| released(x))
                    .last();
                let (lo, hi) = (lo.unwrap_or(b) as usize, hi.unwrap_or(b) as usize + 1);
                (lo * block_elems, hi * block_elems)
            })
            .collect();
        match &mut self.layers {
            KvLayers::F16(l) => each(l, layers, &runs),
            KvLayers::F32(l) => each(l, layers, &runs),
        }
    }

    /// Bytes of the KV tensors held in memory now, per layer (K and V together); `None`
    /// where the OS cannot tell.
    pub fn resident_bytes(&self) -> Option<Vec<usize>> {
        fn each<E: bytemuck::Pod>(bufs: &[[KvBuf<E>; 2]]) -> Option<Vec<usize>> {
            (bufs.iter())
                .map(|[k, v]| Some(k.resident_bytes()? + v.resident_bytes()?))
                .collect()
        }
        match &self.layers {
            KvLayers::F16(l) => each(l),
            KvLayers::F32(l) => each(l),
        }
    }

    /// The rows at `slots`, in order, from every layer, as the cache's bytes: layer by layer,
    /// the keys then the values (what `write_rows` takes back).
    pub fn read_rows(&self, slots: &[usize]) -> Vec<u8> {
        fn each<E: bytemuck::Pod>(
            layers: &[[KvBuf<E>; 2]],
            slots: &[usize],
            (d, hd, bs): (usize, usize, usize),
        ) -> Vec<u8> {
            let mut out = Vec::with_capacity(layers.len() * 2 * slots.len() * d * size_of::<E>());
            for [k, v] in layers {
                for &s in slots {
                    let first = key_index(s, 0, d, bs);
                    for c in 0..d {
                        out.extend_from_slice(bytemuck::bytes_of(&k[first + c * bs]));
                    }
                }
                for &s in slots {
                    for piece in value_pieces(s, hd, d, bs) {
                        out.extend_from_slice(bytemuck::cast_slice(&v[piece]));
                    }
                }
            }
            out
        }
        let shape = (self.kv_dim, self.head_dim, self.block_size);
        match &self.layers {
            KvLayers::F16(l) => each(l, slots, shape),
            KvLayers::F32(l) => each(l, slots, shape),
        }
    }

    /// Write rows laid out as `read_rows` gives them into `slots`; false (nothing written)
    /// when `bytes` is not exactly that many rows of this cache.
    pub fn write_rows(&mut self, slots: &[usize], bytes: &[u8]) -> bool {
        fn each<E: bytemuck::Pod>(
            layers: &mut [[KvBuf<E>; 2]],
            slots: &[usize],
            (d, hd, bs): (usize, usize, usize),
            bytes: &[u8],
        ) -> bool {
            let row = d * size_of::<E>();
            if bytes.len() != layers.len() * 2 * slots.len() * row {
                return false;
            }
            let mut rows = bytes.chunks_exact(row);
            for [k, v] in layers.iter_mut() {
                for (&s, r) in slots.iter().zip(rows.by_ref()) {
                    let first = key_index(s, 0, d, bs);
                    for (c, e) in r.chunks_exact(size_of::<E>()).enumerate() {
                        k[first + c * bs] = bytemuck::pod_read_unaligned(e);
                    }
                }
                for (&s, r) in slots.iter().zip(rows.by_ref()) {
                    let heads = r.chunks_exact(hd * size_of::<E>());
                    for (piece, head) in value_pieces(s, hd, d, bs).zip(heads) {
                        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut v[piece]);
                        dst.copy_from_slice(head);
                    }
                }
            }
            true
        }
        let shape = (self.kv_dim, self.head_dim, self.block_size);
        match &mut self.layers {
            KvLayers::F16(l) => each(l, slots, shape, bytes),
            KvLayers::F32(l) => each(l, slots, shape, bytes),
        }
    }

    /// Copy the first `num_tokens` rows of block `src` into block `dst` in every layer
    /// (copy-on-write of a shared partial block).
    pub fn copy_block(&mut self, src: u32, dst: u32, num_tokens: usize) {
        fn each<E: bytemuck::Pod>(
            layers: &mut [[KvBuf<E>; 2]],
            src: u32,
            dst: u32,
            n: usize,
            (d, hd, bs): (usize, usize, usize),
        ) {
            let (s, t) = (src as usize * bs * d, dst as usize * bs * d);
            for [k, v] in layers.iter_mut() {
                // Keys: the first `n` of each of the block's `d` runs.
                for c in 0..d {
                    k.copy_within(s + c * bs..s + c * bs + n, t + c * bs);
                }
                // Values: the first `n` rows of each head's piece.
                for h in (0..d).step_by(hd) {
                    let at = h * bs;
                    v.copy_within(s + at..s + at + n * hd, t + at);
                }
            }
        }
        let shape = (self.kv_dim, self.head_dim, self.block_size);
        match &mut self.layers {
            KvLayers::F16(l) => each(l, src, dst, num_tokens, shape),
            KvLayers::F32(l) => each(l, src, dst, num_tokens, shape),
        }
    }

    /// Move KV rows (`moves`: source slot, destination slot) in every layer, rotating each
    /// key by `delta` positions with `rotate` on the way (values are copied as they are): a
    /// window's retained tokens moved to the positions they take once the evicted tokens are
    /// gone. Sources and destinations must not overlap.
    pub fn move_rows_rotating_keys(
        &mut self,
        moves: &[(usize, usize)],
        rotate: impl Fn(usize, &mut [f32]),
    ) {
        fn each<E: bytemuck::Pod>(
            layers: &mut [[KvBuf<E>; 2]],
            moves: &[(usize, usize)],
            (d, hd, bs): (usize, usize, usize),
            to: impl Fn(E) -> f32,
            from: impl Fn(f32) -> E,
            rotate: &dyn Fn(usize, &mut [f32]),
        ) {
            let mut row = vec![0f32; d];
            for (layer, [k, v]) in layers.iter_mut().enumerate() {
                for &(src, dst) in moves {
                    let (from_k, to_k) = (key_index(src, 0, d, bs), key_index(dst, 0, d, bs));
                    for (c, r) in row.iter_mut().enumerate() {
                        *r = to(k[from_k + c * bs]);
                    }
                    rotate(layer, &mut row);
                    for (c, r) in row.iter().enumerate() {
                        k[to_k + c * bs] = from(*r);
                    }
                    for (from_v, to_v) in
                        value_pieces(src, hd, d, bs).zip(value_pieces(dst, hd, d, bs))
                    {
                        v.copy_within(from_v, to_v.start);
                    }
                }
            }
        }
        let shape = (self.kv_dim, self.head_dim, self.block_size);
        match &mut self.layers {
            KvLayers::F16(l) => each(l, moves, shape, f16::to_f32, f16::from_f32, &rotate),
            KvLayers::F32(l) => each(l, moves, shape, |x| x, |x| x, &rotate),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_kernels::attention::{write_kv, AttnShape};

    const HEADS: usize = 3;
    const HEAD_DIM: usize = 4;
    const BS: usize = 4;
    const KV_DIM: usize = HEADS * HEAD_DIM;

    fn shape() -> AttnShape {
        AttnShape {
            num_heads: HEADS,
            num_kv_heads: HEADS,
            head_dim: HEAD_DIM,
            block_size: BS,
            window: None,
            scale: 1.0,
        }
    }

    /// Token `t`'s key and value rows: distinct values everywhere.
    fn rows(t: usize) -> (Vec<f32>, Vec<f32>) {
        let k = (0..KV_DIM).map(|c| (t * 100 + c) as f32).collect();
        let v = (0..KV_DIM).map(|c| -((t * 100 + c) as f32)).collect();
        (k, v)
    }

    /// A 2-layer F32 cache with token `t` written by the attention kernels' own `write_kv`
    /// into slot `slots[t]` of every layer.
    fn cache_with(slots: &[usize]) -> KvCache {
        let mut kv = KvCache::new(2, (HEADS, HEAD_DIM), 6, BS, KvDtype::F32);
        let KvLayers::F32(layers) = &mut kv.layers else {
            unreachable!()
        };
        for [k, v] in layers.iter_mut() {
            for (t, &s) in slots.iter().enumerate() {
                let (kr, vr) = rows(t);
                write_kv(k, v, &kr, &vr, &[s as u32], shape());
            }
        }
        kv
    }

    /// What `read_rows` should give for tokens `ts` in both layers: keys then values.
    fn expected(ts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..2 {
            for part in [0, 1] {
                for &t in ts {
                    let (k, v) = rows(t);
                    out.extend_from_slice(bytemuck::cast_slice(if part == 0 { &k } else { &v }));
                }
            }
        }
        out
    }

    #[test]
    fn rows_read_back_in_slot_order_as_attention_wrote_them() {
        let slots = [5, 6, 13, 0];
        let kv = cache_with(&slots);
        assert_eq!(kv.read_rows(&slots), expected(&[0, 1, 2, 3]));
        // And written back elsewhere, read back the same.
        let mut other = KvCache::new(2, (HEADS, HEAD_DIM), 6, BS, KvDtype::F32);
        assert!(other.write_rows(&[20, 21, 2, 9], &kv.read_rows(&slots)));
        assert_eq!(other.read_rows(&[20, 21, 2, 9]), expected(&[0, 1, 2, 3]));
        assert!(!other.write_rows(&[1], &[0u8; 3]));
    }

    #[test]
    fn copy_block_copies_the_first_rows_of_every_head() {
        // Block 1 holds tokens 0..4 in slots 4..8; block 3 holds token 4 in slot 15.
        let mut kv = cache_with(&[4, 5, 6, 7, 15]);
        kv.copy_block(1, 3, 3);
        assert_eq!(kv.read_rows(&[12, 13, 14]), expected(&[0, 1, 2]));
        // The destination's row past the copied ones is untouched.
        assert_eq!(kv.read_rows(&[15]), expected(&[4]));
    }

    #[test]
    fn moved_rows_carry_every_head_of_their_values() {
        let mut kv = cache_with(&[1, 2, 9]);
        kv.move_rows_rotating_keys(&[(9, 3), (2, 17)], |_, _| {});
        assert_eq!(kv.read_rows(&[1, 17, 3]), expected(&[0, 1, 2]));
    }
}
