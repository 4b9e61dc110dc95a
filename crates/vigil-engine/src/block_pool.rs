//! Paged KV block accounting: ref counts, chain-hash prefix cache, LRU free list (filled in by the engine-pieces work).
