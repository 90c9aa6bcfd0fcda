//! Sampling: per-request parameters, the batch sampler, stop strings and beam search.

pub mod beam;
pub mod math;
mod params;
mod sampler;
mod stop;
pub mod structured;
#[cfg(test)]
mod tests;

pub use math::argmax;
pub use params::{SamplingParams, MAX_LOGPROBS};
pub use sampler::{apply_penalties, sample_batch, Sample, SampledRow, SamplerRow};
pub use stop::{holdback, OutputText};
pub use structured::{GrammarCompiler, StructuredOutput};
