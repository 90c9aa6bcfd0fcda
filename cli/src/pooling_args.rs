//! vLLM's flags that run a model as an embedder (`--runner pooling`, `--convert embed`,
//! `--task embed`, `--pooler-config`), and the pooling they ask for.

use anyhow::{anyhow, bail, Result};
use clap::Args;
use infer_core::EmbedParams;

/// vLLM's `--runner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runner {
    Auto,
    Generate,
    Pooling,
}

/// vLLM's `--convert` (the conversions infer makes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Convert {
    Auto,
    None,
    Embed,
}

/// vLLM's deprecated `--task` (the tasks infer runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Task {
    Auto,
    Generate,
    #[value(alias = "embedding")]
    Embed,
}

#[derive(Debug, Clone, Args)]
pub struct PoolingArgs {
    /// What the model is run for (vLLM's): `generate`, or `pooling`: an embedding model
    /// serving /v1/embeddings only. `auto`: generate, unless --convert or --task say embed.
    #[arg(long, value_enum, default_value = "auto")]
    pub runner: Runner,
    /// `embed` runs a generative model as an embedder: its final-normed hidden states,
    /// pooled (vLLM's; implies --runner pooling).
    #[arg(long, value_enum, default_value = "auto")]
    pub convert: Convert,
    /// vLLM's older spelling: `embed` or `embedding` is --runner pooling --convert embed.
    #[arg(long, value_enum, default_value = "auto")]
    pub task: Task,
    /// An embedding model's pooling as JSON (vLLM's): '{"pooling_type": "MEAN",
    /// "normalize": true}'; pooling types LAST (the default), MEAN, CLS.
    #[arg(long, alias = "override-pooler-config", value_name = "JSON")]
    pub pooler_config: Option<String>,
}

impl PoolingArgs {
    /// The pooling of a server started as an embedding model (`None`: it generates);
    /// `tensor_parallel` is the group size asked for.
    pub fn params(&self, tensor_parallel: usize) -> Result<Option<EmbedParams>> {
        let embed = self.convert == Convert::Embed || self.task == Task::Embed;
        let pooling = match (self.runner, embed) {
            (Runner::Generate, true) => {
                bail!("--runner generate cannot serve a model converted to embed")
            }
            (Runner::Generate, false) => false,
            (_, true) => true,
            (runner, false) => runner == Runner::Pooling,
        };
        if self.task == Task::Generate && pooling {
            bail!("--task generate contradicts --runner pooling / --convert embed");
        }
        if !pooling {
            if self.pooler_config.is_some() {
                bail!("--pooler-config needs an embedding model: add --runner pooling");
            }
            return Ok(None);
        }
        if tensor_parallel > 1 {
            bail!("--runner pooling runs on one device: drop --tensor-parallel-size");
        }
        let params = match &self.pooler_config {
            None => EmbedParams::default(),
            Some(text) => infer_web::api::embeddings::parse_pooler_config(text)
                .map_err(|e| anyhow!("--pooler-config: {e}"))?,
        };
        Ok(Some(params))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infer_core::PoolingType;

    fn args(runner: Runner, convert: Convert, task: Task, config: Option<&str>) -> PoolingArgs {
        PoolingArgs {
            runner,
            convert,
            task,
            pooler_config: config.map(str::to_string),
        }
    }

    #[test]
    fn each_spelling_of_embed_makes_a_pooling_server() {
        use {Convert as C, Runner as R, Task as T};
        let pooled = |a: PoolingArgs| a.params(1).unwrap();
        assert_eq!(pooled(args(R::Auto, C::Auto, T::Auto, None)), None);
        assert_eq!(pooled(args(R::Generate, C::None, T::Generate, None)), None);
        let default = Some(EmbedParams::default());
        assert_eq!(pooled(args(R::Pooling, C::Auto, T::Auto, None)), default);
        assert_eq!(pooled(args(R::Auto, C::Embed, T::Auto, None)), default);
        assert_eq!(pooled(args(R::Auto, C::Auto, T::Embed, None)), default);
        let mean = pooled(args(
            R::Pooling,
            C::Auto,
            T::Auto,
            Some(r#"{"pooling_type":"MEAN"}"#),
        ));
        assert_eq!(mean.map(|p| p.pooling), Some(PoolingType::Mean));
        for bad in [
            args(R::Generate, C::Embed, T::Auto, None),
            args(R::Pooling, C::Auto, T::Generate, None),
            args(R::Auto, C::Auto, T::Auto, Some("{}")),
            args(R::Pooling, C::Auto, T::Auto, Some(r#"{"softmax":true}"#)),
        ] {
            assert!(bad.params(1).is_err(), "{bad:?}");
        }
        assert!(args(R::Pooling, C::Auto, T::Auto, None).params(2).is_err());
    }
}
