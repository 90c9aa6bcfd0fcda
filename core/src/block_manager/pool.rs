//! The device block pool: reference counts, an index-based free list, and the prefix cache.
//!
//! A block whose reference count drops to zero goes back to `free` unless it holds a cached
//! prefix block: then it parks in an LRU list (index-based doubly linked) and can be revived
//! by a prefix hit until it is evicted. Allocation prefers blocks holding nothing, then evicts
//! from the LRU head.

use std::collections::HashMap;

use crate::narrow::u32_index;

pub type BlockId = u32;
/// Chained hash of a full block: `hash(parent block's hash, this block's token ids)`.
pub type BlockHash = u64;

const NIL: u32 = u32::MAX;

/// What a cached block holds; compared in full on a hit, so a hash collision is a miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    pub hash: BlockHash,
    pub parent: Option<BlockHash>,
    pub tokens: Box<[u32]>,
}

#[derive(Debug, Clone)]
pub struct DevicePool {
    ref_counts: Vec<u32>,
    keys: Vec<Option<CacheKey>>,
    /// Unreferenced blocks holding no cached prefix; popped from the end.
    free: Vec<BlockId>,
    lru_prev: Vec<u32>,
    lru_next: Vec<u32>,
    lru_head: u32,
    lru_tail: u32,
    lru_len: usize,
    cached: HashMap<BlockHash, BlockId>,
}

impl DevicePool {
    pub fn new(num_blocks: usize) -> Self {
        DevicePool {
            ref_counts: vec![0; num_blocks],
            keys: vec![None; num_blocks],
            // Reversed, so low ids come out first.
            free: (0..num_blocks).rev().map(u32_index).collect(),
            lru_prev: vec![NIL; num_blocks],
            lru_next: vec![NIL; num_blocks],
            lru_head: NIL,
            lru_tail: NIL,
            lru_len: 0,
            cached: HashMap::new(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks an allocation can get: empty ones plus evictable cached ones.
    pub fn num_available(&self) -> usize {
        self.free.len() + self.lru_len
    }

    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_counts[b as usize]
    }

    /// A block with reference count 1, or `None` when none is available.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.lru_head;
                if b == NIL {
                    return None;
                }
                self.lru_remove(b);
                if let Some(key) = self.keys[b as usize].take() {
                    self.cached.remove(&key.hash);
                }
                b
            }
        };
        self.ref_counts[b as usize] = 1;
        Some(b)
    }

    /// Takes one more reference; revives the block if it was parked in the LRU list.
    pub fn incref(&mut self, b: BlockId) {
        if self.ref_counts[b as usize] == 0 {
            self.lru_remove(b);
        }
        self.ref_counts[b as usize] += 1;
    }

    /// Drops one reference. At zero a cached block parks at the LRU tail (evicted last), any
    /// other block goes back to the free list.
    pub fn decref(&mut self, b: BlockId) {
        let rc = &mut self.ref_counts[b as usize];
        debug_assert!(*rc > 0, "block {b} freed twice");
        *rc -= 1;
        if *rc == 0 {
            if self.keys[b as usize].is_some() {
                self.lru_push_back(b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// The cached block holding exactly `key`, if any.
    pub fn lookup(&self, key: &CacheKey) -> Option<BlockId> {
        let &b = self.cached.get(&key.hash)?;
        (self.keys[b as usize].as_ref() == Some(key)).then_some(b)
    }

    /// Whether the block is parked in the LRU list (unreferenced but cached).
    pub fn is_evictable(&self, b: BlockId) -> bool {
        self.ref_counts[b as usize] == 0 && self.keys[b as usize].is_some()
    }

    /// Makes a full, referenced block findable by its key. A key already cached elsewhere is
    /// left as it is (the duplicate stays private to its sequence).
    pub fn register(&mut self, b: BlockId, key: CacheKey) {
        debug_assert!(self.ref_counts[b as usize] > 0);
        if self.keys[b as usize].is_some() || self.cached.contains_key(&key.hash) {
            return;
        }
        self.cached.insert(key.hash, b);
        self.keys[b as usize] = Some(key);
    }

    fn lru_remove(&mut self, b: BlockId) {
        let (p, n) = (self.lru_prev[b as usize], self.lru_next[b as usize]);
        if p == NIL {
            self.lru_head = n;
        } else {
            self.lru_next[p as usize] = n;
        }
        if n == NIL {
            self.lru_tail = p;
        } else {
            self.lru_prev[n as usize] = p;
        }
        self.lru_prev[b as usize] = NIL;
        self.lru_next[b as usize] = NIL;
        self.lru_len -= 1;
    }

    fn lru_push_back(&mut self, b: BlockId) {
        self.lru_prev[b as usize] = self.lru_tail;
        self.lru_next[b as usize] = NIL;
        if self.lru_tail == NIL {
            self.lru_head = b;
        } else {
            self.lru_next[self.lru_tail as usize] = b;
        }
        self.lru_tail = b;
        self.lru_len += 1;
    }

    /// The LRU list from head (next evicted) to tail.
    pub fn eviction_order(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.lru_len);
        let mut b = self.lru_head;
        while b != NIL {
            out.push(b);
            b = self.lru_next[b as usize];
        }
        out
    }

    /// Checks that every block is in exactly one place (referenced, free, or LRU) and that
    /// `expected_refs[b]` (counted from the owners' block tables) matches each count.
    pub fn check(&self, expected_refs: &[u32]) -> Result<(), String> {
        let n = self.num_blocks();
        let mut seen = vec![0u8; n];
        for &b in &self.free {
            seen[b as usize] += 1;
            if self.keys[b as usize].is_some() {
                return Err(format!("free block {b} still holds a cache key"));
            }
        }
        let lru = self.eviction_order();
        if lru.len() != self.lru_len {
            return Err(format!(
                "LRU list has {} blocks, counted {}",
                lru.len(),
                self.lru_len
            ));
        }
        for &b in &lru {
            seen[b as usize] += 1;
            if self.keys[b as usize].is_none() {
                return Err(format!("LRU block {b} holds no cache key"));
            }
        }
        for b in 0..n {
            let rc = self.ref_counts[b];
            if rc != expected_refs[b] {
                return Err(format!(
                    "block {b}: reference count {rc}, but {} owners",
                    expected_refs[b]
                ));
            }
            let places = seen[b] as u32 + u32::from(rc > 0);
            if places != 1 {
                return Err(format!("block {b} is in {places} places (refs {rc})"));
            }
        }
        for (&hash, &b) in &self.cached {
            if self.keys[b as usize].as_ref().map(|k| k.hash) != Some(hash) {
                return Err(format!(
                    "cache entry {hash:#x} points at block {b} with another key"
                ));
            }
        }
        let keyed = self.keys.iter().filter(|k| k.is_some()).count();
        if keyed != self.cached.len() {
            return Err(format!(
                "{keyed} blocks hold keys but the cache indexes {}",
                self.cached.len()
            ));
        }
        Ok(())
    }
}

/// Host (swap) blocks: reference counts and a free list; no caching.
#[derive(Debug, Clone)]
pub struct HostPool {
    ref_counts: Vec<u32>,
    free: Vec<BlockId>,
}

impl HostPool {
    pub fn new(num_blocks: usize) -> Self {
        HostPool {
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks).rev().map(u32_index).collect(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_counts[b as usize]
    }

    pub fn allocate(&mut self) -> Option<BlockId> {
        let b = self.free.pop()?;
        self.ref_counts[b as usize] = 1;
        Some(b)
    }

    pub fn incref(&mut self, b: BlockId) {
        self.ref_counts[b as usize] += 1;
    }

    pub fn decref(&mut self, b: BlockId) {
        let rc = &mut self.ref_counts[b as usize];
        debug_assert!(*rc > 0, "host block {b} freed twice");
        *rc -= 1;
        if *rc == 0 {
            self.free.push(b);
        }
    }

    pub fn check(&self, expected_refs: &[u32]) -> Result<(), String> {
        let mut free = vec![false; self.num_blocks()];
        for &b in &self.free {
            if std::mem::replace(&mut free[b as usize], true) {
                return Err(format!("host block {b} is free twice"));
            }
        }
        for (b, (&rc, &want)) in self.ref_counts.iter().zip(expected_refs).enumerate() {
            if rc != want || (rc == 0) != free[b] {
                return Err(format!(
                    "host block {b}: refs {rc}, owners {want}, free {}",
                    free[b]
                ));
            }
        }
        Ok(())
    }
}
