//! The backend a command runs on (`--backend`): its own module so the model loader and the
//! parallel launcher, which both name it, need not import each other.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    Cpu,
    Wgpu,
    Cuda,
}
