//! Models written once against the `Backend` trait: one decoder forward (`decoder`) whose
//! blocks take each family's features (its MLP dense or routed: `mlp`), the registry that maps a file to its family
//! (`registry`), the families themselves (`families`, one small file each) and where each
//! weight lives in a file (`names`).

pub mod decoder;
pub mod families;
pub mod gguf_keys;
pub mod hf_keys;
mod mlp;
pub mod names;
pub mod read_config;
pub mod registry;
pub mod weight_name;

pub use decoder::{checked_max_model_len, upload_shard, upload_weight, LoadProgress, Model};
pub use registry::{Family, FamilySpec, FAMILIES};
