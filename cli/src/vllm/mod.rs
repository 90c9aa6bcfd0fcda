//! `vllm serve` command lines, run as they are: the model as a positional argument,
//! `--config FILE.yaml`, and every vLLM flag infer does not parse itself taken or refused by
//! the table in `flags` before clap parses the rest.

pub mod flags;

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use flags::{Arity, Disposition, VllmFlag, FLAGS};

/// A `serve` command line rewritten for clap, and notes on the vLLM flags taken as what infer
/// does anyway (logged at start-up).
#[derive(Debug, Default, PartialEq)]
pub struct Rewritten {
    pub args: Vec<String>,
    pub notes: Vec<String>,
}

/// The flag a token names, with its value when attached (`--flag=value`, `-O3`).
fn lookup(token: &str) -> Option<(&'static VllmFlag, bool, Option<String>)> {
    let (name, attached) = match token.split_once('=') {
        Some((n, v)) if token.starts_with("--") => (n, Some(v.to_string())),
        _ => (token, None),
    };
    for flag in FLAGS {
        if flag.name == name || flag.short.contains(&name) {
            return Some((flag, true, attached));
        }
        if flag.arity == Arity::Switch && name.strip_prefix("--no-") == flag.name.strip_prefix("--")
        {
            return Some((flag, false, attached));
        }
    }
    // `-O3`: a short flag with its value attached.
    FLAGS.iter().find_map(|flag| {
        flag.short.iter().find_map(|s| {
            let rest = token.strip_prefix(s)?;
            (flag.arity == Arity::Value && !rest.is_empty() && !token.starts_with("--"))
                .then(|| (flag, true, Some(rest.trim_start_matches('=').to_string())))
        })
    })
}

/// Rewrites `infer serve ...` (other commands pass through): `--config` files expanded in
/// front of the command line (which wins), `serve MODEL` turned into `--model MODEL`, and
/// the vLLM flags infer does not parse removed (accepted) or refused with an error that says
/// why and what to do instead.
pub fn rewrite(args: Vec<String>) -> Result<Rewritten> {
    if args.get(1).map(String::as_str) != Some("serve") {
        return Ok(Rewritten {
            args,
            notes: Vec::new(),
        });
    }
    let mut rest: Vec<String> = args[2..].to_vec();
    // vLLM's `vllm serve MODEL`: the model first.
    if rest.first().is_some_and(|a| !a.starts_with('-')) {
        rest.insert(0, "--model".into());
    }
    let mut from_files = Vec::new();
    let mut cli = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        let token = &rest[i];
        if let Some(path) = token.strip_prefix("--config=") {
            from_files.extend(config_args(Path::new(path))?);
            i += 1;
        } else if token == "--config" {
            let path = rest.get(i + 1).context("--config needs a file")?;
            from_files.extend(config_args(Path::new(path))?);
            i += 2;
        } else {
            cli.push(token.clone());
            i += 1;
        }
    }
    let mut out = Rewritten {
        args: args[..2].to_vec(),
        notes: Vec::new(),
    };
    let mut all = from_files;
    all.extend(cli);
    filter(all, &mut out)?;
    Ok(out)
}

/// Keeps what clap parses; takes or refuses the rest per `FLAGS`.
fn filter(args: Vec<String>, out: &mut Rewritten) -> Result<()> {
    let mut i = 0;
    while i < args.len() {
        let token = &args[i];
        i += 1;
        if !token.starts_with('-') || token == "-" {
            out.args.push(token.clone());
            continue;
        }
        let Some((flag, on, attached)) = lookup(token) else {
            out.args.push(token.clone());
            continue;
        };
        let takes_value = flag.arity == Arity::Value;
        // The value is the next token unless attached.
        let value = match (&attached, takes_value) {
            (Some(v), _) => Some(v.clone()),
            (None, true) => {
                let v = args.get(i).cloned();
                i += 1;
                v
            }
            (None, false) => None,
        };
        let spelled = if on {
            flag.name.to_string()
        } else {
            format!("--no-{}", &flag.name[2..])
        };
        match (flag.disposition, on) {
            (Disposition::Own, _) => {
                // clap knows the long spelling of every flag it parses.
                let short = flag.short.contains(&token.as_str());
                out.args.push(if short {
                    flag.name.to_string()
                } else {
                    token.clone()
                });
                if attached.is_none() {
                    out.args.extend(value);
                }
            }
            (Disposition::Inherent(why), _) => {
                out.notes.push(format!("vLLM's {spelled}: {why}"));
            }
            (Disposition::Values(allowed, why), _) => {
                let v = value.unwrap_or_default();
                if !allowed.iter().any(|a| a.eq_ignore_ascii_case(&v)) {
                    bail!(
                        "{spelled} {v}: a vLLM setting infer does not support ({why}); accepted: {}",
                        allowed
                            .iter()
                            .filter(|a| !a.is_empty())
                            .copied()
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                out.notes.push(format!("vLLM's {spelled} {v}: {why}"));
            }
            (Disposition::Refused(why), _) => {
                bail!("{spelled} is a vLLM flag infer does not support: {why}")
            }
        }
    }
    Ok(())
}

/// vLLM's `--config FILE.yaml`: each key a flag (`max-model-len` or `max_model_len`), each
/// value its value; `true` is the bare switch, `false` its `--no-` form, a list repeats the
/// values, a mapping is passed as JSON.
fn config_args(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config: reading {}", path.display()))?;
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("--config {}: not YAML", path.display()))?;
    let map = match serde_json::to_value(yaml) {
        Ok(Value::Object(map)) => map,
        Ok(Value::Null) => return Ok(Vec::new()),
        Ok(_) => bail!(
            "--config {}: expected a mapping of flags to values",
            path.display()
        ),
        Err(e) => bail!("--config {}: {e}", path.display()),
    };
    let mut args = Vec::new();
    for (key, value) in map {
        let flag = format!("--{}", key.replace('_', "-"));
        if flag == "--config" {
            bail!(
                "--config {}: a config file cannot name another",
                path.display()
            );
        }
        match value {
            Value::Bool(true) => args.push(flag),
            Value::Bool(false) => args.push(format!("--no-{}", &flag[2..])),
            Value::Null => {}
            Value::Array(items) => {
                for item in items {
                    args.push(flag.clone());
                    args.push(scalar(&item));
                }
            }
            other => {
                args.push(flag);
                args.push(scalar(&other));
            }
        }
    }
    Ok(args)
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// vLLM's human-readable integers (`--max-model-len 4k`): `k`/`m`/`g` are powers of 1000
/// (decimals allowed: `1.5k`), `K`/`M`/`G` powers of 1024 (whole numbers only).
#[expect(
    clippy::cast_possible_truncation,
    reason = "units are whole powers of 1000 and 1024; a value is checked whole and in range"
)]
pub fn human_int(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let err = || format!("`{text}`: expected a number such as 4096, 4k (4000) or 4K (4096)");
    let Some(last) = t.chars().last() else {
        return Err(err());
    };
    let (digits, unit) = match last {
        'k' => (&t[..t.len() - 1], 1e3),
        'm' => (&t[..t.len() - 1], 1e6),
        'g' => (&t[..t.len() - 1], 1e9),
        'K' => (&t[..t.len() - 1], 1024.0),
        'M' => (&t[..t.len() - 1], 1024.0 * 1024.0),
        'G' => (&t[..t.len() - 1], 1024.0 * 1024.0 * 1024.0),
        _ => return t.parse::<usize>().map_err(|_| err()),
    };
    if last.is_ascii_uppercase() {
        let n: usize = digits.parse().map_err(|_| err())?;
        return n.checked_mul(unit as usize).ok_or_else(err);
    }
    let x: f64 = digits.parse().map_err(|_| err())?;
    let v = x * unit;
    if !(v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < usize::MAX as f64) {
        return Err(err());
    }
    Ok(v as usize)
}

#[cfg(test)]
mod tests;
