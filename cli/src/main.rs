//! `infer`: LLM inference from the command line.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

fn main() {
    infer_cli::main()
}
