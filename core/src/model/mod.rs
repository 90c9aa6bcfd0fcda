//! Model definitions written once against the `Backend` trait.

pub mod llama;

pub use llama::LlamaModel;
