use super::*;

fn sched(
    blocks: usize,
    host: usize,
    seqs: usize,
    tokens: usize,
    mode: PreemptionMode,
) -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_seqs: seqs,
        max_num_batched_tokens: tokens,
        preemption_mode: mode,
    };
    Scheduler::new(cfg, BlockManager::new(4, blocks, host, false)).unwrap()
}

fn add(s: &mut Scheduler, id: SeqId, len: usize) {
    let state = SeqState::new(id, (0..len as u32).collect());
    s.add(id, state).unwrap();
}

fn plan(s: &mut Scheduler) -> Vec<(SeqId, usize, usize, bool)> {
    let out = s.schedule().unwrap();
    s.check_invariants().unwrap();
    out.chunks
        .iter()
        .map(|c| (c.seq, c.num_computed, c.num_new, c.want_logits))
        .collect()
}

#[test]
fn long_prompts_are_prefilled_in_chunks_beside_decodes() {
    let mut s = sched(32, 0, 4, 8, PreemptionMode::Recompute);
    add(&mut s, 0, 3);
    add(&mut s, 1, 20);
    // Step 1: all of prompt 0, the first 5 tokens of prompt 1.
    assert_eq!(plan(&mut s), [(0, 0, 3, true), (1, 0, 5, false)]);
    s.append_token(0, 9);
    // Then a decode for 0 and 7-token chunks for 1 until its last one wants logits.
    assert_eq!(plan(&mut s), [(0, 3, 1, true), (1, 5, 7, false)]);
    s.append_token(0, 9);
    assert_eq!(plan(&mut s), [(0, 4, 1, true), (1, 12, 7, false)]);
    s.append_token(0, 9);
    assert_eq!(plan(&mut s), [(0, 5, 1, true), (1, 19, 1, true)]);
}

#[test]
fn an_earlier_long_prompt_leaves_a_token_for_each_later_decode() {
    let mut s = sched(64, 0, 4, 8, PreemptionMode::Recompute);
    add(&mut s, 1, 2);
    add(&mut s, 2, 2);
    assert_eq!(plan(&mut s), [(1, 0, 2, true), (2, 0, 2, true)]);
    // A long prompt that arrived before them (as a preempted, recomputed request does)
    // joins the running queue ahead of them.
    add(&mut s, 0, 40);
    s.append_token(1, 5);
    s.append_token(2, 5);
    assert_eq!(
        plan(&mut s),
        [(1, 2, 1, true), (2, 2, 1, true), (0, 0, 6, false)]
    );
    // Its chunks leave a token for each decoding sequence after it, every step.
    for computed in [6, 12, 18] {
        s.append_token(1, 5);
        s.append_token(2, 5);
        assert_eq!(s.num_decoding(), 2);
        let step = plan(&mut s);
        assert_eq!(step[0], (0, computed, 6, false), "{step:?}");
        assert_eq!(step.len(), 3, "{step:?}");
    }
    // Paced to 4 tokens a step: 2 for the chunk, 1 for each decode.
    s.append_token(1, 5);
    s.append_token(2, 5);
    s.set_step_tokens(Some(4));
    let step = plan(&mut s);
    assert_eq!(step[0], (0, 24, 2, false), "{step:?}");
    assert_eq!(step.len(), 3, "{step:?}");
}

#[test]
fn the_latest_arrival_is_preempted_and_recomputed_first_come_first_served() {
    // 4 blocks of 4 tokens: two 8-token prompts fill the pool.
    let mut s = sched(4, 0, 4, 16, PreemptionMode::Recompute);
    add(&mut s, 0, 8);
    add(&mut s, 1, 7);
    add(&mut s, 2, 2);
    // 2 does not fit behind them (and FCFS does not let it jump ahead later either).
    assert_eq!(plan(&mut s), [(0, 0, 8, true), (1, 0, 7, true)]);
    s.append_token(0, 1);
    s.append_token(1, 1);
    // Sequence 0 needs a fifth block: 1 (the latest running) gives its blocks up.
    let out = s.schedule().unwrap();
    assert_eq!(out.preempted, [1]);
    assert_eq!(out.chunks.len(), 1);
    assert_eq!(s.seq(1).unwrap().num_computed, 0);
    assert_eq!((s.num_running(), s.num_waiting()), (1, 2));
    s.check_invariants().unwrap();
    s.append_token(0, 1);
    // 1 comes back before 2, prompt and output recomputed together.
    s.remove(0);
    assert_eq!(plan(&mut s), [(1, 0, 8, true), (2, 0, 2, true)]);
}

#[test]
fn nothing_new_is_admitted_while_a_sequence_is_swapped_out() {
    let mut s = sched(4, 8, 4, 16, PreemptionMode::Swap);
    add(&mut s, 0, 8);
    add(&mut s, 1, 8);
    assert_eq!(plan(&mut s).len(), 2);
    s.append_token(0, 1);
    s.append_token(1, 1);
    add(&mut s, 2, 1);
    let out = s.schedule().unwrap();
    assert_eq!(out.preempted, [1]);
    assert_eq!(out.cache_ops.swap_out, [(2, 0), (3, 1)]);
    assert_eq!(s.num_swapped(), 1);
    s.append_token(0, 1);
    // 0 keeps decoding; 2 would fit in the one free block but must wait for 1.
    assert_eq!(plan(&mut s), [(0, 9, 1, true)]);
    s.append_token(0, 1);
    s.remove(0);
    let out = s.schedule().unwrap();
    assert_eq!(out.cache_ops.swap_in.len(), 2);
    // 1 resumes where it was: one decode token, and only then 2 is admitted.
    assert_eq!(
        out.chunks[0],
        ScheduledChunk {
            seq: 1,
            num_computed: 8,
            num_new: 1,
            want_logits: true,
            all_logits: false,
            num_spec: 0
        }
    );
    assert_eq!(out.chunks[1].seq, 2);
    s.check_invariants().unwrap();
}

#[test]
fn bad_configs_are_refused() {
    let cfg = |seqs, tokens| SchedulerConfig {
        max_num_seqs: seqs,
        max_num_batched_tokens: tokens,
        preemption_mode: PreemptionMode::Swap,
    };
    assert!(cfg(0, 8).validate().is_err());
    assert!(cfg(16, 8).validate().is_err());
    assert!("swap".parse::<PreemptionMode>().is_ok());
    assert!("sometimes".parse::<PreemptionMode>().is_err());
}
