//! `infer`: LLM inference from the command line.

fn main() {
    infer_cli::main()
}
