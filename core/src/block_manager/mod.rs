//! The block manager: maps each sequence to its blocks in the paged KV cache (PagedAttention).
//!
//! Sequences share blocks by reference count: a forked sequence shares all its parent's
//! blocks, a new prompt shares the cached blocks of a matching prefix. A sequence about to
//! write into a shared block gets a private copy first (copy-on-write; the manager returns the
//! copy for the backend to perform). Preempted sequences can move their blocks to host memory
//! and back (swap). Only the last block of a sequence is ever partly empty. When every layer
//! attends within a sliding window, blocks that have left the window are released while the
//! sequence runs (`release_out_of_window`): the table keeps their entries, which no kernel
//! reads again, and only the live tail counts.

mod groups;
mod pool;
mod rollback;
mod swap;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

pub use pool::{BlockHash, BlockId, CacheKey};
use pool::{DevicePool, HostPool};

use crate::error::{BackendError, InferError, Result};

pub type SeqId = u64;

/// A block copy `(from, to)`: within the device (copy-on-write) or between device and host.
pub type BlockCopy = (BlockId, BlockId);

/// Checks that every copy's source is below `from_blocks` and its destination below
/// `to_blocks` (backends check the engine's copies before touching device memory); the error
/// names the first that is not.
pub fn check_copies(
    op: &'static str,
    copies: &[BlockCopy],
    from_blocks: usize,
    to_blocks: usize,
) -> std::result::Result<(), BackendError> {
    let (sources, destinations) = (copies.iter().map(|c| &c.0), copies.iter().map(|c| &c.1));
    BackendError::check_indices(op, "source block", sources, from_blocks)?;
    BackendError::check_indices(op, "destination block", destinations, to_blocks)
}

#[derive(Debug, Clone, Default)]
struct SeqBlocks {
    table: Vec<BlockId>,
    /// Leading entries of `table` given back to the pool (out of every layer's window): stale
    /// ids that no kernel reads, skipped by every reference count.
    released: usize,
    on_host: bool,
    /// Hashes of the leading full blocks (prefix caching on).
    hashes: Vec<BlockHash>,
    /// The first block's parent in the hash chain: its request's `cache_salt_root`.
    root: Option<BlockHash>,
}

impl SeqBlocks {
    /// The entries the sequence still holds.
    fn live(&self) -> &[BlockId] {
        &self.table[self.released..]
    }
}

/// Cached leading blocks of a prompt, found by `BlockManager::find_cached_prefix`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixHit {
    pub blocks: Vec<BlockId>,
    hashes: Vec<BlockHash>,
    /// The chain's root (`cache_salt_root`), kept by the sequence allocated from the hit.
    root: Option<BlockHash>,
}

impl PrefixHit {
    /// No cached blocks, for a sequence whose chain starts at `root`.
    pub fn none(root: Option<BlockHash>) -> Self {
        PrefixHit {
            root,
            ..PrefixHit::default()
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }
}

/// The root of a salted request's hash chain (vLLM's `cache_salt`): its first block's parent,
/// so its blocks match only those of requests with the same salt (a cache key compares the
/// parent as well as the tokens).
pub fn cache_salt_root(salt: &str) -> BlockHash {
    let mut h = DefaultHasher::new();
    "cache_salt".hash(&mut h);
    salt.hash(&mut h);
    h.finish()
}

fn chain_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    // SipHash with fixed zero keys: stable within a build, which is all a cache key needs.
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[derive(Debug, Clone)]
pub struct BlockManager {
    block_size: usize,
    device: DevicePool,
    host: HostPool,
    seqs: HashMap<SeqId, SeqBlocks>,
    prefix_caching: bool,
    /// Blocks kept free when admitting new prompts, so running sequences can grow a while
    /// before anything must be preempted.
    watermark_blocks: usize,
    /// Every layer's attention window, when all of them slide: older blocks can go.
    sliding_window: Option<usize>,
}

impl BlockManager {
    pub fn new(
        block_size: usize,
        num_device_blocks: usize,
        num_host_blocks: usize,
        prefix_caching: bool,
    ) -> Self {
        BlockManager {
            block_size,
            device: DevicePool::new(num_device_blocks),
            host: HostPool::new(num_host_blocks),
            seqs: HashMap::new(),
            prefix_caching,
            watermark_blocks: num_device_blocks / 100,
            sliding_window: None,
        }
    }

    /// Releases blocks once they leave `window` (a model whose every layer slides).
    pub fn with_sliding_window(self, window: Option<usize>) -> Self {
        BlockManager {
            sliding_window: window.filter(|&w| w > 0),
            ..self
        }
    }

    /// Gives back the device blocks of `seq` that no query from position `num_computed` on
    /// can see: with a window W, the next query sees keys from `num_computed + 1 - W`.
    /// Returns how many blocks went back. A cached block stays findable by later prompts.
    pub fn release_out_of_window(&mut self, seq: SeqId, num_computed: usize) -> usize {
        let Some(window) = self.sliding_window else {
            return 0;
        };
        let Some(s) = self.seqs.get_mut(&seq) else {
            return 0;
        };
        if s.on_host {
            return 0;
        }
        let first_needed = (num_computed + 1).saturating_sub(window) / self.block_size;
        // Only full, registered blocks are released (the hashes cover them with caching on).
        let upto = first_needed.min(s.table.len());
        let upto = if self.prefix_caching {
            upto.min(s.hashes.len())
        } else {
            upto
        };
        let mut n = 0;
        while s.released < upto {
            self.device.decref(s.table[s.released]);
            s.released += 1;
            n += 1;
        }
        n
    }

    /// Whether blocks are given back as windows slide (every layer of the model slides).
    pub fn releases_out_of_window(&self) -> bool {
        self.sliding_window.is_some()
    }

    /// Leading blocks of `seq` already given back (see `release_out_of_window`).
    pub fn num_released(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.released)
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_device_blocks(&self) -> usize {
        self.device.num_blocks()
    }

    pub fn num_host_blocks(&self) -> usize {
        self.host.num_blocks()
    }

    /// Device blocks an allocation can get (empty plus evictable cached ones).
    pub fn num_available_device(&self) -> usize {
        self.device.num_available()
    }

    pub fn num_free_host(&self) -> usize {
        self.host.num_free()
    }

    /// Fraction of device blocks referenced by sequences.
    pub fn device_usage(&self) -> f64 {
        let n = self.device.num_blocks().max(1);
        (n - self.device.num_available()) as f64 / n as f64
    }

    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.table.as_slice())
    }

    pub fn is_on_host(&self, seq: SeqId) -> bool {
        self.seqs.get(&seq).is_some_and(|s| s.on_host)
    }

    fn seq(&self, seq: SeqId) -> Result<&SeqBlocks> {
        self.seqs
            .get(&seq)
            .ok_or_else(|| InferError::KvCache(format!("sequence {seq} has no blocks")))
    }

    /// The cached blocks matching the start of `tokens`, at most `(len - 1) / block_size` of
    /// them: the last token is always computed, since its logits are needed.
    pub fn find_cached_prefix(&self, tokens: &[u32], root: Option<BlockHash>) -> PrefixHit {
        let mut hit = PrefixHit::none(root);
        if !self.prefix_caching {
            return hit;
        }
        let max_blocks = tokens.len().saturating_sub(1) / self.block_size;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let parent = hit.hashes.last().copied().or(root);
            let key = CacheKey {
                hash: chain_hash(parent, chunk),
                parent,
                tokens: chunk.into(),
            };
            match self.device.lookup(&key) {
                Some(b) => {
                    hit.blocks.push(b);
                    hit.hashes.push(key.hash);
                }
                None => break,
            }
        }
        hit
    }

    /// Whether a new sequence holding `num_tokens` tokens (the hit's included) fits now,
    /// keeping the watermark free when `keep_watermark`.
    pub fn can_allocate(&self, hit: &PrefixHit, num_tokens: usize, keep_watermark: bool) -> bool {
        self.has_room(self.blocks_to_allocate(hit, num_tokens), keep_watermark)
    }

    /// Device blocks a new sequence of `num_tokens` tokens takes: cached blocks of its hit
    /// that must be revived plus fresh ones.
    pub fn blocks_to_allocate(&self, hit: &PrefixHit, num_tokens: usize) -> usize {
        let revived = hit
            .blocks
            .iter()
            .filter(|&&b| self.device.is_evictable(b))
            .count();
        revived + self.blocks_for(num_tokens).saturating_sub(hit.blocks.len())
    }

    /// Whether `blocks` device blocks can be taken now, keeping the watermark when asked.
    pub fn has_room(&self, blocks: usize, keep_watermark: bool) -> bool {
        let reserve = if keep_watermark {
            self.watermark_blocks
        } else {
            0
        };
        self.device.num_available() >= blocks + reserve
    }

    /// Gives a new sequence the hit's blocks plus fresh ones up to `num_tokens` tokens; full
    /// blocks become findable by later prompts. Check `can_allocate` first.
    pub fn allocate(
        &mut self,
        seq: SeqId,
        hit: PrefixHit,
        tokens: &[u32],
        num_tokens: usize,
    ) -> Result<()> {
        if self.seqs.contains_key(&seq) {
            return Err(InferError::KvCache(format!(
                "sequence {seq} already has blocks"
            )));
        }
        if !self.can_allocate(&hit, num_tokens, false) || num_tokens > tokens.len() {
            return Err(InferError::KvCache(format!(
                "cannot allocate {num_tokens} tokens for sequence {seq}"
            )));
        }
        for &b in &hit.blocks {
            self.device.incref(b);
        }
        let mut s = SeqBlocks {
            table: hit.blocks,
            released: 0,
            on_host: false,
            hashes: hit.hashes,
            root: hit.root,
        };
        // Cannot run out: `can_allocate` counted these blocks.
        grow(
            &mut self.device,
            self.block_size,
            self.prefix_caching,
            seq,
            &mut s,
            tokens,
            num_tokens,
        )?;
        self.seqs.insert(seq, s);
        Ok(())
    }

    /// Device blocks `append_slots` would take: new blocks plus one copy if the block being
    /// written is shared.
    pub fn blocks_to_append(&self, seq: SeqId, num_computed: usize, num_new: usize) -> usize {
        let Some(s) = self.seqs.get(&seq) else {
            return self.blocks_for(num_computed + num_new);
        };
        let new = self
            .blocks_for(num_computed + num_new)
            .saturating_sub(s.table.len());
        let first = num_computed / self.block_size;
        let cow = s
            .table
            .get(first)
            .is_some_and(|&b| self.device.ref_count(b) > 1);
        new + usize::from(cow)
    }

    /// Makes room for `num_new` tokens after `num_computed`, copying a shared block about to
    /// be written. Returns the copies to perform, or `None` (nothing changed) when the pool
    /// has too few blocks.
    pub fn append_slots(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        num_computed: usize,
        num_new: usize,
    ) -> Result<Option<Vec<BlockCopy>>> {
        self.append_speculative_slots(seq, tokens, num_computed, num_new, 0)
    }

    /// `append_slots` for `num_new` known tokens followed by `num_spec` proposed ones
    /// (speculative decoding): the table grows over the proposals too, but only blocks the
    /// known tokens fill are registered in the prefix cache, since proposals may be rejected
    /// (`truncate` rolls the table back).
    pub fn append_speculative_slots(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        num_computed: usize,
        num_new: usize,
        num_spec: usize,
    ) -> Result<Option<Vec<BlockCopy>>> {
        let end = num_computed + num_new;
        let needed = self.blocks_to_append(seq, num_computed, num_new + num_spec);
        let (bs, caching) = (self.block_size, self.prefix_caching);
        let Self { device, seqs, .. } = self;
        let s = seqs
            .get_mut(&seq)
            .ok_or_else(|| InferError::KvCache(format!("sequence {seq} has no blocks")))?;
        if s.on_host || end > tokens.len() || s.table.len() < num_computed / bs {
            return Err(InferError::KvCache(format!(
                "sequence {seq}: cannot append {num_new} tokens after {num_computed}"
            )));
        }
        if needed > device.num_available() {
            return Ok(None);
        }
        let mut copies = Vec::new();
        let first = num_computed / bs;
        if let Some(&old) = s.table.get(first) {
            if device.ref_count(old) > 1 {
                let new = device.allocate().ok_or_else(|| out_of_blocks(seq))?;
                device.decref(old);
                s.table[first] = new;
                copies.push((old, new));
            }
        }
        // `tokens` ends at `end`: only the known tokens' blocks are registered.
        grow(device, bs, caching, seq, s, &tokens[..end], end + num_spec)?;
        Ok(Some(copies))
    }

    /// The child shares every block of the parent (parallel samples, beam candidates).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<()> {
        let s = self.seq(parent)?.clone();
        if s.on_host || self.seqs.contains_key(&child) {
            return Err(InferError::KvCache(format!(
                "cannot fork sequence {parent} into {child}"
            )));
        }
        for &b in s.live() {
            self.device.incref(b);
        }
        self.seqs.insert(child, s);
        Ok(())
    }

    /// Releases a sequence's blocks, last first: cached blocks at the end of a chain are then
    /// evicted before the prefix they extend.
    pub fn free(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.remove(&seq) else {
            return;
        };
        for &b in s.live().iter().rev() {
            if s.on_host {
                self.host.decref(b);
            } else {
                self.device.decref(b);
            }
        }
    }

    /// Device blocks from the next evicted on (for tests and debugging).
    pub fn eviction_order(&self) -> Vec<BlockId> {
        self.device.eviction_order()
    }

    /// Proves that no block leaked: every reference count equals the number of block-table
    /// entries naming the block, and every unreferenced block is free or evictable, once.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut device = vec![0u32; self.device.num_blocks()];
        let mut host = vec![0u32; self.host.num_blocks()];
        for (id, s) in &self.seqs {
            let refs = if s.on_host { &mut host } else { &mut device };
            for &b in s.live() {
                *refs
                    .get_mut(b as usize)
                    .ok_or_else(|| format!("sequence {id}: block {b} out of range"))? += 1;
            }
        }
        self.device.check(&device)?;
        self.host.check(&host)
    }
}

/// Gives `s` fresh blocks up to `num_tokens` tokens and, with prefix caching, registers the
/// blocks those tokens fill. Full blocks are registered when scheduled, before the step computes
/// them; a prompt that hits them in the same step is still right, as every layer writes the
/// step's K/V before attending.
fn grow(
    device: &mut DevicePool,
    block_size: usize,
    prefix_caching: bool,
    seq: SeqId,
    s: &mut SeqBlocks,
    tokens: &[u32],
    num_tokens: usize,
) -> Result<()> {
    while s.table.len() < num_tokens.div_ceil(block_size) {
        s.table
            .push(device.allocate().ok_or_else(|| out_of_blocks(seq))?);
    }
    register_full_blocks(
        device,
        block_size,
        prefix_caching,
        s,
        tokens,
        num_tokens.min(tokens.len()),
    );
    Ok(())
}

/// With prefix caching, registers the blocks the first `num_tokens` of `tokens` fill.
fn register_full_blocks(
    device: &mut DevicePool,
    block_size: usize,
    prefix_caching: bool,
    s: &mut SeqBlocks,
    tokens: &[u32],
    num_tokens: usize,
) {
    if !prefix_caching {
        return;
    }
    for i in s.hashes.len()..num_tokens / block_size {
        let chunk = &tokens[i * block_size..(i + 1) * block_size];
        let parent = s.hashes.last().copied().or(s.root);
        let hash = chain_hash(parent, chunk);
        let key = CacheKey {
            hash,
            parent,
            tokens: chunk.into(),
        };
        // A released entry is stale (the block may be another sequence's now): hash only.
        if i >= s.released {
            device.register(s.table[i], key);
        }
        s.hashes.push(hash);
    }
}

fn out_of_blocks(seq: SeqId) -> InferError {
    InferError::KvCache(format!("sequence {seq}: out of blocks"))
}
