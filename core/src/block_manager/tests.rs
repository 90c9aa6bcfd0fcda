use super::*;

fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

fn alloc(bm: &mut BlockManager, seq: SeqId, tokens: &[u32]) -> usize {
    let hit = bm.find_cached_prefix(tokens, None);
    let n = hit.num_blocks();
    bm.allocate(seq, hit, tokens, tokens.len()).unwrap();
    bm.check_invariants().unwrap();
    n
}

#[test]
fn allocate_and_append_take_whole_blocks_lowest_ids_first() {
    let mut bm = BlockManager::new(4, 8, 0, false);
    alloc(&mut bm, 1, &toks(0..10));
    alloc(&mut bm, 2, &toks(0..3));
    assert_eq!(bm.block_table(1).unwrap(), [0, 1, 2]);
    assert_eq!(bm.block_table(2).unwrap(), [3]);

    let t = toks(0..16);
    // 11 tokens still fit in three blocks; 13 need a fourth.
    assert_eq!(bm.append_slots(1, &t, 10, 1).unwrap(), Some(vec![]));
    assert_eq!(bm.block_table(1).unwrap(), [0, 1, 2]);
    assert_eq!(bm.append_slots(1, &t, 11, 2).unwrap(), Some(vec![]));
    assert_eq!(bm.block_table(1).unwrap(), [0, 1, 2, 4]);
    bm.check_invariants().unwrap();

    // Freed blocks are reused, the most recently freed first.
    bm.free(2);
    alloc(&mut bm, 3, &toks(0..2));
    assert_eq!(bm.block_table(3).unwrap(), [3]);
    assert_eq!(bm.num_available_device(), 3);
    // Too few blocks: nothing changes.
    assert_eq!(bm.append_slots(1, &toks(0..40), 13, 20).unwrap(), None);
    assert_eq!(bm.block_table(1).unwrap(), [0, 1, 2, 4]);
    bm.check_invariants().unwrap();
}

#[test]
fn fork_shares_blocks_and_the_first_writer_copies() {
    let mut bm = BlockManager::new(4, 8, 0, false);
    let t = toks(0..12);
    alloc(&mut bm, 1, &t[..10]);
    bm.fork(1, 2).unwrap();
    assert_eq!(bm.block_table(2).unwrap(), [0, 1, 2]);
    assert_eq!(bm.device.ref_count(2), 2);
    bm.check_invariants().unwrap();

    // The child writes token 10 into shared block 2: it gets a copy in block 3.
    assert_eq!(bm.blocks_to_append(2, 10, 1), 1);
    assert_eq!(bm.append_slots(2, &t, 10, 1).unwrap(), Some(vec![(2, 3)]));
    assert_eq!(bm.block_table(2).unwrap(), [0, 1, 3]);
    // The parent now owns block 2 alone and writes in place.
    assert_eq!(bm.append_slots(1, &t, 10, 1).unwrap(), Some(vec![]));
    assert_eq!(bm.block_table(1).unwrap(), [0, 1, 2]);
    // Full blocks stay shared; a write past them takes a fresh block, no copy.
    bm.fork(1, 3).unwrap();
    assert_eq!(
        bm.append_slots(3, &toks(0..13), 12, 1).unwrap(),
        Some(vec![])
    );
    assert_eq!(bm.block_table(3).unwrap(), [0, 1, 2, 4]);
    bm.check_invariants().unwrap();
    for s in [1, 2, 3] {
        bm.free(s);
    }
    assert_eq!(bm.num_available_device(), 8);
    bm.check_invariants().unwrap();
}

#[test]
fn prefix_blocks_are_reused_and_compared_by_tokens() {
    let mut bm = BlockManager::new(4, 8, 0, true);
    let a = toks(0..10);
    assert_eq!(alloc(&mut bm, 1, &a), 0);
    // Same first 8 tokens: blocks 0 and 1 are shared, the rest is new.
    let mut b = toks(0..8);
    b.extend([50, 51, 52]);
    assert_eq!(alloc(&mut bm, 2, &b), 2);
    assert_eq!(bm.block_table(2).unwrap(), [0, 1, 3]);
    assert_eq!(bm.device.ref_count(0), 2);
    // A different first block breaks the chain even if the second block matches.
    let mut c = vec![99, 1, 2, 3];
    c.extend(4..10);
    assert_eq!(alloc(&mut bm, 3, &c), 0);
    // An identical 8-token prompt reuses only one block: its last token must be computed.
    assert_eq!(alloc(&mut bm, 4, &toks(0..8)), 1);
    assert_eq!(bm.block_table(4).unwrap(), [0, 7]);
    bm.check_invariants().unwrap();
}

#[test]
fn freed_cached_blocks_are_evicted_lru_chain_ends_first() {
    let mut bm = BlockManager::new(4, 6, 0, true);
    alloc(&mut bm, 1, &toks(0..12)); // blocks 0 1 2, all full and cached
    alloc(&mut bm, 2, &toks(100..108)); // blocks 3 4
    bm.free(1);
    bm.free(2);
    // Each chain is parked tail first: 2 1 0, then 4 3.
    assert_eq!(bm.eviction_order(), [2, 1, 0, 4, 3]);
    assert_eq!(bm.num_available_device(), 6);
    bm.check_invariants().unwrap();

    // A hit revives blocks 0 and 1 out of the LRU list.
    let mut p = toks(0..8);
    p.push(77);
    assert_eq!(alloc(&mut bm, 3, &p), 2);
    assert_eq!(bm.block_table(3).unwrap(), [0, 1, 5]);
    assert_eq!(bm.eviction_order(), [2, 4, 3]);
    // The empty block (5) went first; now allocation evicts from the LRU head.
    alloc(&mut bm, 4, &toks(200..205));
    assert_eq!(bm.block_table(4).unwrap(), [2, 4]);
    assert_eq!(bm.eviction_order(), [3]);
    // The evicted chain end is gone from the cache; its surviving parent still hits.
    assert_eq!(bm.find_cached_prefix(&toks(0..13), None).blocks, [0, 1]);
    assert_eq!(bm.find_cached_prefix(&toks(100..109), None).blocks, [3]);
    bm.check_invariants().unwrap();
}

#[test]
fn swap_out_and_in_map_blocks_both_ways() {
    let mut bm = BlockManager::new(4, 6, 4, false);
    alloc(&mut bm, 1, &toks(0..6)); // 0 1
    alloc(&mut bm, 2, &toks(0..9)); // 2 3 4
    assert!(!bm.can_swap_out(&[2, 1]));
    assert_eq!(bm.swap_out(&[2]).unwrap(), [(2, 0), (3, 1), (4, 2)]);
    assert!(bm.is_on_host(2));
    assert_eq!(bm.block_table(2).unwrap(), [0, 1, 2]);
    assert_eq!(bm.num_free_host(), 1);
    bm.check_invariants().unwrap();
    // A swapped sequence cannot grow; its device blocks went back to the pool.
    assert!(bm.append_slots(2, &toks(0..10), 9, 1).is_err());
    alloc(&mut bm, 3, &toks(0..14)); // 4 3 2 5
    assert_eq!(bm.block_table(3).unwrap(), [4, 3, 2, 5]);
    assert!(!bm.can_swap_in(&[2], 0));
    bm.free(3);
    assert!(bm.can_swap_in(&[2], 1));
    // Freed last block first, so the pool hands back 4 3 2.
    assert_eq!(bm.swap_in(&[2]).unwrap(), [(0, 4), (1, 3), (2, 2)]);
    assert_eq!(bm.block_table(2).unwrap(), [4, 3, 2]);
    assert_eq!(bm.num_free_host(), 4);
    bm.check_invariants().unwrap();
}

#[test]
fn swapping_forked_sequences_together_copies_shared_blocks_once() {
    let mut bm = BlockManager::new(4, 6, 6, false);
    alloc(&mut bm, 1, &toks(0..6));
    bm.fork(1, 2).unwrap();
    bm.append_slots(2, &toks(0..7), 6, 1).unwrap();
    assert_eq!(bm.block_table(2).unwrap(), [0, 2]);
    assert_eq!(bm.swap_out(&[1, 2]).unwrap(), [(0, 0), (1, 1), (2, 2)]);
    assert_eq!(bm.block_table(1).unwrap(), [0, 1]);
    assert_eq!(bm.block_table(2).unwrap(), [0, 2]);
    assert_eq!(bm.num_available_device(), 6);
    bm.check_invariants().unwrap();
    // Swap-out freed 1, then 0 and 2: the free list hands them back 2 0 1.
    assert_eq!(bm.swap_in(&[1, 2]).unwrap(), [(0, 2), (1, 0), (2, 1)]);
    assert_eq!(bm.block_table(2).unwrap(), [2, 1]);
    bm.check_invariants().unwrap();
    bm.free(1);
    bm.free(2);
    assert_eq!(bm.num_free_host(), 6);
    assert_eq!(bm.num_available_device(), 6);
}

#[test]
fn invariant_check_catches_a_leak() {
    let mut bm = BlockManager::new(4, 4, 0, false);
    alloc(&mut bm, 1, &toks(0..5));
    bm.device.incref(0);
    assert!(bm.check_invariants().is_err());
}

#[test]
fn salted_chains_hit_only_their_own_salt() {
    let mut bm = BlockManager::new(4, 32, 0, true);
    let prompt = toks(0..13);
    let (a, b) = (
        Some(cache_salt_root("tenant-a")),
        Some(cache_salt_root("tenant-b")),
    );
    let salted = |bm: &mut BlockManager, seq: SeqId, root| {
        let hit = bm.find_cached_prefix(&prompt, root);
        let n = hit.num_blocks();
        bm.allocate(seq, hit, &prompt, prompt.len()).unwrap();
        bm.check_invariants().unwrap();
        n
    };
    assert_eq!(salted(&mut bm, 1, a), 0);
    // The same prompt: no hit unsalted or under another salt, all of it under the same.
    assert_eq!(bm.find_cached_prefix(&prompt, None).num_blocks(), 0);
    assert_eq!(bm.find_cached_prefix(&prompt, b).num_blocks(), 0);
    assert_eq!(salted(&mut bm, 2, a), 3);
    // An unsalted copy caches a chain of its own, which salted prompts do not see.
    assert_eq!(alloc(&mut bm, 3, &prompt), 0);
    assert_eq!(alloc(&mut bm, 4, &prompt), 3);
    assert_eq!(salted(&mut bm, 5, b), 0);
    let first3 = |bm: &BlockManager, seq| bm.block_table(seq).unwrap()[..3].to_vec();
    assert_eq!(first3(&bm, 4), first3(&bm, 3));
    assert_eq!(first3(&bm, 2), first3(&bm, 1));
    assert_ne!(first3(&bm, 3), first3(&bm, 1));
    assert_ne!(first3(&bm, 5), first3(&bm, 1));
    // A group member sharing the first one's blocks keeps the salt for the blocks it fills.
    let shared = bm.shared_prefix(1, 3).unwrap();
    assert_eq!(shared.root, a);
}
