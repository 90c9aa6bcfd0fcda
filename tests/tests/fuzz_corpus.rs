//! Issue 34: the GGUF header, config and tokenizer path against hostile bytes, in CI. The
//! corpus is the committed model fixtures (the seeds `core/fuzz`'s cargo-fuzz target starts
//! from); each is replayed, then mutated the ways fuzzers find bugs (flipped bytes, size and
//! count fields overwritten with hostile values, truncation), deterministically. Every
//! mutant must come back (an error is fine) quickly, without a panic; an allocation sized by a
//! lying field would abort the whole test binary.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use infer_core::gguf::GgufFile;
use infer_core::model::read_config::read_untrusted;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MUTANTS_PER_SEED: usize = 2000;

fn seeds() -> Vec<(String, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let mut out = Vec::new();
    for dir in ["families", "tiny"] {
        let mut paths: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
            .collect();
        paths.sort();
        for p in paths {
            out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
    out.push((
        "tiny_llama".into(),
        infer_tests::gguf_writer::tiny_llama(3).to_bytes(),
    ));
    assert!(out.len() >= 10, "{} seeds", out.len());
    out
}

/// Where the header ends (the first tensor's data): mutations land before it.
fn header_len(bytes: &[u8]) -> usize {
    let file = GgufFile::from_header("seed", bytes, bytes.len() as u64)
        .unwrap()
        .unwrap();
    file.tensors
        .values()
        .map(|t| t.offset)
        .min()
        .unwrap_or(bytes.len())
}

/// Values fuzzers try in size and count fields.
const HOSTILE: [u64; 9] = [
    0,
    1,
    0xff,
    1 << 31,
    (1 << 32) - 1,
    1 << 40,
    u64::MAX / 2,
    u64::MAX - 7,
    u64::MAX,
];

fn mutate(seed: &[u8], header: usize, rng: &mut StdRng) -> Vec<u8> {
    let mut m = seed.to_vec();
    for _ in 0..rng.random_range(1..4) {
        let header = header.min(m.len());
        if header < 16 {
            break;
        }
        match rng.random_range(0..4) {
            // A byte flipped.
            0 => {
                let at = rng.random_range(0..header);
                m[at] ^= 1 << rng.random_range(0..8);
            }
            // A 64-bit field (lengths, counts, dims, offsets) overwritten.
            1 => {
                let at = rng.random_range(0..header.saturating_sub(8));
                let v = HOSTILE[rng.random_range(0..HOSTILE.len())];
                m[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            // A 32-bit field (types, dimension counts, integer metadata) overwritten.
            2 => {
                let at = rng.random_range(0..header.saturating_sub(4));
                // The low half of a hostile 64-bit value (all ones stays all ones).
                let v = HOSTILE[rng.random_range(0..HOSTILE.len())].to_le_bytes();
                let v = u32::from_le_bytes([v[0], v[1], v[2], v[3]]);
                m[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            // Truncated.
            _ => m.truncate(rng.random_range(0..m.len())),
        }
    }
    m
}

#[test]
fn the_header_path_survives_the_corpus_and_its_mutants() {
    let mut rng = StdRng::seed_from_u64(34);
    let mut slowest = (Duration::ZERO, String::new());
    let (mut refused, mut read) = (0, 0);
    for (name, seed) in seeds() {
        // The seed itself reads (the families' fixtures are real models).
        if let Err(e) = read_untrusted(&seed) {
            panic!("{name}: {e}");
        }
        let header = header_len(&seed);
        for i in 0..MUTANTS_PER_SEED {
            let mutant = mutate(&seed, header, &mut rng);
            let started = Instant::now();
            let outcome = std::panic::catch_unwind(|| read_untrusted(&mutant).map(|_| ()));
            let took = started.elapsed();
            match outcome {
                Ok(Ok(())) => read += 1,
                Ok(Err(_)) => refused += 1,
                Err(_) => {
                    let path = std::env::temp_dir().join(format!("gguf-panic-{i}.gguf"));
                    std::fs::write(&path, &mutant).unwrap();
                    panic!(
                        "{name}: mutant {i} panicked (written to {})",
                        path.display()
                    );
                }
            }
            if took > slowest.0 {
                slowest = (took, format!("{name} #{i}"));
            }
        }
    }
    eprintln!(
        "{refused} mutants refused, {read} read; slowest {:?} ({})",
        slowest.0, slowest.1
    );
    assert!(refused > 0);
    assert!(slowest.0 < Duration::from_secs(10), "{slowest:?}");
}
