//! vLLM's flag list, flag by flag: each one is parsed by clap (infer's own), taken with a
//! note, or refused with an error that says it is a vLLM flag and why.

use clap::Parser;

use super::flags::{Arity, Disposition, FLAGS, SOURCE};
use super::*;
use crate::{Cli, Command};

/// A value each of infer's own vLLM flags takes.
fn sample(name: &str) -> &'static str {
    match name {
        "--model" => "m.gguf",
        "--tokenizer" | "--served-model-name" | "--chat-template" | "--api-key" => "x",
        "--dtype" => "auto",
        "--seed" => "0",
        "--max-model-len" | "--max-num-batched-tokens" => "4k",
        "--generation-config" => "vllm",
        "--override-generation-config" => r#"{"temperature": 0.5}"#,
        "--default-chat-template-kwargs" => r#"{"enable_thinking": false}"#,
        "--load-format" => "auto",
        "--distributed-executor-backend" => "uni",
        "--tensor-parallel-size" => "1",
        "--block-size" => "16",
        "--gpu-memory-utilization" => "0.8",
        "--kv-cache-memory-bytes" => "1G",
        "--swap-space" => "1",
        "--num-gpu-blocks-override" => "64",
        "--speculative-config" => r#"{"method": "ngram", "num_speculative_tokens": 2}"#,
        "--max-num-seqs" => "8",
        "--scheduling-policy" => "priority",
        "--tool-call-parser" => "hermes",
        "--max-log-len" => "100",
        "--host" => "127.0.0.1",
        "--port" => "8001",
        "--uvicorn-log-level" => "warning",
        "--disable-access-log-for-endpoints" => "/health,/metrics",
        "--allowed-origins" => r#"["*"]"#,
        "--allowed-methods" | "--allowed-headers" => "*",
        "--root-path" => "/api",
        "--max-logprobs" => "50",
        "--reasoning-parser" => "deepseek_r1",
        "--max-cudagraph-capture-size" => "256",
        "--runner" => "pooling",
        "--convert" => "embed",
        "--task" => "embed",
        "--pooler-config" | "--override-pooler-config" => r#"{"pooling_type": "MEAN"}"#,
        "--ssl-keyfile" | "--ssl-certfile" | "--ssl-ca-certs" => "x.pem",
        "--ssl-cert-reqs" => "2",
        other => panic!("no sample value for {other}"),
    }
}

fn serve(extra: &[&str]) -> Vec<String> {
    ["infer", "serve", "--model", "m.gguf"]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

fn parse(args: Vec<String>) -> Result<(Cli, Vec<String>), String> {
    let rewritten = rewrite(args).map_err(|e| format!("{e:#}"))?;
    let cli = Cli::try_parse_from(rewritten.args).map_err(|e| e.to_string())?;
    Ok((cli, rewritten.notes))
}

#[test]
fn every_vllm_flag_is_parsed_taken_or_refused_by_name() {
    let (mut own, mut taken, mut refused) = (0, 0, 0);
    for flag in FLAGS {
        if flag.name == "--config" {
            continue; // needs a file: its own test
        }
        let value = match flag.disposition {
            Disposition::Own if flag.arity == Arity::Value => Some(sample(flag.name)),
            Disposition::Values(allowed, _) => Some(allowed[0]),
            _ if flag.arity == Arity::Value => Some("1"),
            _ => None,
        };
        let mut args = vec![flag.name];
        args.extend(value);
        let got = parse(serve(&args));
        match flag.disposition {
            Disposition::Own => {
                own += 1;
                got.unwrap_or_else(|e| panic!("{}: {e}", flag.name));
            }
            Disposition::Inherent(_) | Disposition::Values(..) => {
                taken += 1;
                let (_, notes) = got.unwrap_or_else(|e| panic!("{}: {e}", flag.name));
                assert!(notes.iter().any(|n| n.contains(flag.name)), "{notes:?}");
            }
            Disposition::Refused(why) => {
                refused += 1;
                let e = got
                    .err()
                    .unwrap_or_else(|| panic!("{} was taken", flag.name));
                assert!(e.contains("is a vLLM flag infer does not support"), "{e}");
                assert!(e.contains(flag.name) && e.contains(why), "{e}");
            }
        }
        // Short spellings and `=` forms mean the same.
        for short in flag.short {
            let mut args = vec![*short];
            args.extend(value);
            let short_got = parse(serve(&args));
            assert_eq!(short_got.is_ok(), got_ok(flag), "{short}");
        }
        if let Some(v) = value {
            let joined = format!("{}={v}", flag.name);
            assert_eq!(parse(serve(&[&joined])).is_ok(), got_ok(flag), "{joined}");
        }
    }
    // The tally the README quotes.
    eprintln!("{SOURCE}: {own} own, {taken} taken, {refused} refused");
    assert!(FLAGS.len() >= 190, "the list is cut short: {}", FLAGS.len());
}

fn got_ok(flag: &flags::VllmFlag) -> bool {
    !matches!(flag.disposition, Disposition::Refused(_))
}

#[test]
fn a_value_outside_the_accepted_ones_is_refused_with_the_list() {
    let e = parse(serve(&["--kv-cache-dtype", "fp8"])).err().unwrap();
    assert!(
        e.contains("--kv-cache-dtype fp8") && e.contains("accepted: auto"),
        "{e}"
    );
    let e = parse(serve(&["-pp", "2"])).err().unwrap();
    assert!(e.contains("pipeline parallelism"), "{e}");
    assert!(parse(serve(&["-O3"])).is_ok());
    assert!(parse(serve(&["--no-enable-chunked-prefill"])).is_err());
    assert!(parse(serve(&["--enable-chunked-prefill"])).is_ok());
}

#[test]
fn a_tutorial_command_line_parses_with_the_model_first() {
    let args: Vec<String> = [
        "infer",
        "serve",
        "Qwen/Qwen3-0.6B",
        "--dtype",
        "auto",
        "--api-key",
        "token-abc123",
        "--seed",
        "0",
        "--enable-prefix-caching",
        "--disable-log-requests",
        "--max-model-len",
        "4K",
        "--trust-remote-code",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (cli, notes) = parse(args).unwrap();
    let Command::Serve(s) = cli.command else {
        panic!("not serve")
    };
    assert_eq!(s.model.model, "Qwen/Qwen3-0.6B");
    assert_eq!(s.model.max_model_len, Some(4096));
    assert_eq!(s.seed, Some(0));
    assert!(!s.model.engine.no_enable_prefix_caching);
    assert!(notes[0].contains("nothing remote ever runs"), "{notes:?}");
    // `--no-enable-prefix-caching` (and infer's older `--no-prefix-caching`) turn it off.
    for off in ["--no-enable-prefix-caching", "--no-prefix-caching"] {
        let (cli, _) = parse(serve(&[off])).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!()
        };
        assert!(s.model.engine.no_enable_prefix_caching, "{off}");
    }
}

#[test]
fn a_config_file_gives_flags_and_the_command_line_wins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vllm.yaml");
    std::fs::write(
        &path,
        "model: /models/a.gguf\nport: 9000\nmax_model_len: 2k\nenable-prefix-caching: false\nallowed-origins: '[\"*\"]'\n",
    )
    .unwrap();
    let args: Vec<String> = [
        "infer",
        "serve",
        "--config",
        path.to_str().unwrap(),
        "--port",
        "9100",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (cli, _) = parse(args).unwrap();
    let Command::Serve(s) = cli.command else {
        panic!()
    };
    assert_eq!(s.model.model, "/models/a.gguf");
    assert_eq!(s.port, 9100);
    assert_eq!(s.model.max_model_len, Some(2000));
    assert!(s.model.engine.no_enable_prefix_caching);
    // A refused vLLM flag in the file is refused too.
    std::fs::write(&path, "enable-lora: true\n").unwrap();
    let args = serve(&["--config", path.to_str().unwrap()]);
    assert!(parse(args).err().unwrap().contains("LoRA"));
}

#[test]
fn human_readable_numbers_read_as_vllm_reads_them() {
    assert_eq!(human_int("4096"), Ok(4096));
    assert_eq!(human_int("4k"), Ok(4000));
    assert_eq!(human_int("4K"), Ok(4096));
    assert_eq!(human_int("1.5k"), Ok(1500));
    assert_eq!(human_int("2M"), Ok(2 << 20));
    assert_eq!(human_int("1m"), Ok(1_000_000));
    assert!(human_int("1.5K").is_err());
    assert!(human_int("-4k").is_err());
    assert!(human_int("k").is_err());
    assert!(human_int("").is_err());
}

#[test]
fn the_docs_table_lists_every_flag_as_the_table_takes_it() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/vllm.md"))
        .expect("docs/vllm.md");
    for flag in FLAGS {
        let row = doc
            .lines()
            .find(|l| {
                l.strip_prefix("| `")
                    .and_then(|r| r.split('`').next())
                    .is_some_and(|n| n.split(' ').next() == Some(flag.name))
            })
            .unwrap_or_else(|| panic!("{} is not in docs/vllm.md", flag.name));
        let column = row.split(" | ").nth(1).unwrap_or_default();
        let want = match flag.disposition {
            Disposition::Own => "honoured",
            Disposition::Inherent(_) | Disposition::Values(..) => "accepted",
            Disposition::Refused(_) => "refused",
        };
        assert!(column.starts_with(want), "{}: {row}", flag.name);
    }
    let count = |f: fn(&Disposition) -> bool| FLAGS.iter().filter(|x| f(&x.disposition)).count();
    let tally = format!(
        "Of the {} flags: {} honoured, {} accepted, {} refused.",
        FLAGS.len(),
        count(|d| matches!(d, Disposition::Own)),
        count(|d| matches!(d, Disposition::Inherent(_) | Disposition::Values(..))),
        count(|d| matches!(d, Disposition::Refused(_))),
    );
    assert!(doc.contains(&tally), "docs/vllm.md should say: {tally}");
}
