//! OpenAI's API as infer speaks it, with no HTTP in it: request bodies (`types`), turning them
//! into engine prompts and sampling parameters (`prepare`), and the JSON the replies and stream
//! chunks are made of (`format`). `infer serve` and the browser engine both use it, so a client
//! gets the same objects from either.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

pub mod defaults;
pub mod embeddings;
pub mod error;
pub mod fields;
pub mod format;
pub mod openapi;
pub mod prepare;
pub mod reasoning;
pub mod responses;
pub mod structured;
pub mod tokenize;
pub mod tools;
pub mod types;

pub use error::RequestError;
pub use types::*;
