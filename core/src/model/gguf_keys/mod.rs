//! Every GGUF metadata key, and what infer does with it: read (by every family or by some),
//! inert (it cannot change the result: names, licences, quantization bookkeeping), or not
//! read — then a file that sets it to anything but its neutral value is refused by name, saying
//! what infer would have done without it. The table (`table.rs`) covers every key llama.cpp's
//! loader and gguf-py know (`scripts/check_gguf_keys.py` checks it against the llama.cpp sdist
//! the project converts with); a key in the architecture's or the tokenizer's namespace that
//! neither knows is refused too.
//!
//! What counts as read is what the loaders asked for (`GgufFile::get` records each key), so the
//! table cannot claim a read the code does not make: a key is accepted when it was read, is
//! inert, or holds its neutral value. Reading a key the table does not list for the family is
//! a bug, reported as one.

mod table;

use crate::config::Family;
use crate::error::{InferError, Result};
use crate::gguf::{GgufFile, GgufValue};

pub use table::{ARCH_KEYS, GLOBAL_KEYS};

/// Which families' loaders read a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Readers {
    All,
    Some(&'static [Family]),
    None,
}

/// A value that leaves the model as it is without the key (llama.cpp's default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Neutral {
    /// Any value changes the model.
    None,
    Bool(bool),
    Ints(&'static [u64]),
    Floats(&'static [f64]),
}

/// One key (after `{arch}.` in `ARCH_KEYS`, whole in `GLOBAL_KEYS`; a trailing `.` matches a
/// prefix) and what infer does with it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyRule {
    pub key: &'static str,
    pub readers: Readers,
    /// Whether the key cannot change the result for a family that does not read it.
    pub inert: bool,
    pub neutral: Neutral,
    /// Why it is inert, or what infer computes without it.
    pub note: &'static str,
}

impl KeyRule {
    pub fn read_by(&self, family: Family) -> bool {
        match self.readers {
            Readers::All => true,
            Readers::Some(list) => list.contains(&family),
            Readers::None => false,
        }
    }

    /// Whether `value` leaves the model as it is without the key.
    pub fn is_neutral(&self, value: &GgufValue) -> bool {
        match self.neutral {
            Neutral::None => false,
            Neutral::Bool(b) => value.as_bool() == Some(b),
            Neutral::Ints(list) => value.as_u64().is_some_and(|v| list.contains(&v)),
            Neutral::Floats(list) => value.as_f64().is_some_and(|v| list.contains(&v)),
        }
    }

    fn matches(&self, name: &str) -> bool {
        match self.key.strip_suffix('.') {
            Some(prefix) => name
                .strip_prefix(prefix)
                .is_some_and(|r| r.starts_with('.')),
            None => self.key == name,
        }
    }
}

/// Namespaces llama.cpp owns besides the architecture's: a key there that no table row knows
/// is refused; keys of any other namespace (a tool's own bookkeeping) are reported and left.
const OWNED_NAMESPACES: &[&str] = &["tokenizer."];

/// The rule of a metadata key in a file of architecture `arch`.
pub fn rule_of(arch: &str, key: &str) -> Option<&'static KeyRule> {
    match key.strip_prefix(arch).and_then(|k| k.strip_prefix('.')) {
        Some(name) => ARCH_KEYS.iter().find(|r| r.matches(name)),
        None => GLOBAL_KEYS.iter().find(|r| r.matches(key)),
    }
}

/// A metadata value as an error message shows it.
fn shown(v: &GgufValue) -> String {
    match v {
        GgufValue::String(s) if s.len() <= 40 => format!("{s:?}"),
        GgufValue::Array(a) if a.len() <= 8 => {
            let items: Vec<String> = a.iter().map(shown).collect();
            format!("[{}]", items.join(", "))
        }
        GgufValue::String(_) | GgufValue::Array(_) => v.describe(),
        GgufValue::Bool(b) => b.to_string(),
        GgufValue::F32(x) => x.to_string(),
        _ => match (v.as_u64(), v.as_f64()) {
            (Some(n), _) => n.to_string(),
            (None, Some(x)) => x.to_string(),
            (None, None) => v.describe(),
        },
    }
}

impl GgufFile {
    /// After the config and tokenizer are read: refuses every key that nothing read, that can
    /// change the result and that is not at its neutral value; fails on a read the table does
    /// not list for `family` (a bug in infer, not in the file).
    pub(crate) fn check_keys(&self, family: Family) -> Result<()> {
        let arch = self
            .metadata
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .unwrap_or_default();
        let name = family.spec().name;
        let read = self.keys_read();
        let owned = |key: &str| {
            key.strip_prefix(arch).is_some_and(|k| k.starts_with('.'))
                || OWNED_NAMESPACES.iter().any(|n| key.starts_with(n))
        };
        for key in &read {
            let granted = match rule_of(arch, key) {
                Some(rule) => rule.read_by(family) || rule.inert,
                None => !owned(key),
            };
            if !granted {
                return Err(InferError::Config(format!(
                    "internal: the {name} loader read GGUF key `{key}`, which the key table \
                     (core/src/model/gguf_keys) does not grant it"
                )));
            }
        }
        let mut foreign = Vec::new();
        for (key, value) in &self.metadata {
            if read.contains(key) {
                continue;
            }
            let refuse = |why: String| {
                Err(self.bad(format!(
                    "metadata `{key}` = {} {why}; refusing rather than computing something \
                     other than the model the file describes",
                    shown(value)
                )))
            };
            match rule_of(arch, key) {
                Some(rule) if rule.inert || rule.is_neutral(value) => {}
                Some(rule) => {
                    return refuse(format!(
                        "is not read by infer's {name} loader (without it: {})",
                        rule.note
                    ))
                }
                None if owned(key) => {
                    return refuse(
                        "is a key neither infer nor llama.cpp's loader knows".to_string(),
                    )
                }
                None => foreign.push(key.as_str()),
            }
        }
        if !foreign.is_empty() {
            tracing::warn!(
                "{}: metadata keys infer does not know, left unread (outside the {arch} and \
                 tokenizer namespaces): {}",
                self.path.display(),
                foreign.join(", ")
            );
        }
        Ok(())
    }
}
