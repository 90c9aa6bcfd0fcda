//! The GGUF header, model configuration and tokenizer from arbitrary bytes: an error is fine, a
//! panic, hang or runaway allocation is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = infer_core::model::read_config::read_untrusted(bytes);
});
