//! Which vector kernels run: the best level this CPU has, or the one `INFER_CPU_ISA` names, so
//! one machine can test and measure every level it has (`scripts/bench_vs_llama_cpp.py`). Every
//! kernel of every level is checked against the scalar one, which runs everywhere.

use std::fmt;
use std::sync::OnceLock;

/// The environment variable that forces a level (`scalar`, `avx2`, `avxvnni`, `avx512`,
/// `avx512vnni`, `neon`, `neon-dotprod`; `auto` or unset: the best this CPU has).
pub const ISA_ENV: &str = "INFER_CPU_ISA";

/// A level of vector kernels. Each level's kernels need only what its CPUs have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust: the reference, on any CPU.
    Scalar,
    /// AVX2 + FMA (Haswell, Zen 1 and later): 16 × 256-bit registers.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 with AVX-VNNI (`vpdpbusd` on 256-bit registers: Alder Lake, Zen 5).
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// AVX-512 F/VL/BW without VNNI (Skylake-SP): 32 × 512-bit registers.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-512 with VNNI (Ice Lake, Zen 4 and later).
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// Advanced SIMD (every aarch64 CPU): 32 × 128-bit registers.
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// NEON with the dot-product extension (`sdot`: Graviton 2+, Ampere, Apple M1+).
    #[cfg(target_arch = "aarch64")]
    NeonDot,
}

impl Isa {
    /// Every level this build knows, from narrowest to widest.
    pub fn all() -> &'static [Isa] {
        &[
            Isa::Scalar,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2,
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot,
        ]
    }

    /// The name `INFER_CPU_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => "avxvnni",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => "avx512vnni",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon",
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot => "neon-dotprod",
        }
    }

    /// Whether this CPU runs this level's kernels.
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => Isa::Avx2.supported() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => Isa::Avx512.supported() && is_x86_feature_detected!("avx512vnni"),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot => {
                Isa::Neon.supported() && std::arch::is_aarch64_feature_detected!("dotprod")
            }
        }
    }

    /// The widest level this CPU runs.
    pub fn detect() -> Isa {
        Isa::available().last().copied().unwrap_or(Isa::Scalar)
    }

    /// Every level this CPU runs, narrowest first (the tests compare each with `Scalar`).
    pub fn available() -> Vec<Isa> {
        Isa::all()
            .iter()
            .copied()
            .filter(|i| i.supported())
            .collect()
    }

    /// The level `INFER_CPU_ISA` names (the best one without it). A name this build does not
    /// know, or a level this CPU lacks, is an error naming the levels it has.
    pub fn from_env() -> Result<Isa, String> {
        match std::env::var(ISA_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Isa::detect()),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{ISA_ENV} is not UTF-8")),
            Ok(name) => Isa::parse(&name),
        }
    }

    fn parse(name: &str) -> Result<Isa, String> {
        let name = name.trim().to_ascii_lowercase();
        if name.is_empty() || name == "auto" {
            return Ok(Isa::detect());
        }
        let levels = || {
            let names: Vec<_> = Isa::available().iter().map(|i| i.name()).collect();
            names.join(", ")
        };
        let Some(isa) = Isa::all().iter().copied().find(|i| i.name() == name) else {
            return Err(format!(
                "{ISA_ENV}={name}: unknown level (this CPU runs: {})",
                levels()
            ));
        };
        if !isa.supported() {
            return Err(format!(
                "{ISA_ENV}={name}: this CPU lacks it (it runs: {})",
                levels()
            ));
        }
        Ok(isa)
    }

    /// The level the kernels run at: `from_env`, read once; where that is an error (callers
    /// that start the CPU backend report it first), the best level.
    pub fn current() -> Isa {
        static CURRENT: OnceLock<Isa> = OnceLock::new();
        *CURRENT.get_or_init(|| Isa::from_env().unwrap_or_else(|_| Isa::detect()))
    }

    /// AVX2 and FMA are usable (every x86 level but `Scalar`).
    #[cfg(target_arch = "x86_64")]
    pub fn has_avx2(self) -> bool {
        self != Isa::Scalar
    }

    /// AVX-512F/VL/BW are usable.
    #[cfg(target_arch = "x86_64")]
    pub fn has_avx512(self) -> bool {
        matches!(self, Isa::Avx512 | Isa::Avx512Vnni)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Evaluates `$body`, an expression in the named arguments, in a function compiled for the
/// level in use (AVX-512F, AVX2 + FMA, or portable), so the loops it inlines vectorize for it.
macro_rules! on_level {
    (($($arg:ident: $ty:ty),*) -> $ret:ty, $body:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            fn avx512($($arg: $ty),*) -> $ret {
                $body
            }
            #[target_feature(enable = "avx2,fma")]
            fn avx2($($arg: $ty),*) -> $ret {
                $body
            }
            let isa = crate::isa::Isa::current();
            if isa.has_avx512() {
                // SAFETY: the level in use has AVX-512F, and this CPU runs it (`Isa::current`).
                return unsafe { avx512($($arg),*) };
            }
            if isa.has_avx2() {
                // SAFETY: the level in use has AVX2 and FMA, and this CPU runs it.
                return unsafe { avx2($($arg),*) };
            }
        }
        $body
    }};
}
pub(crate) use on_level;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_levels_are_refused() {
        for &isa in Isa::all() {
            match Isa::parse(isa.name()) {
                Ok(parsed) => assert_eq!(parsed, isa),
                Err(e) => assert!(!isa.supported() && e.contains("lacks"), "{e}"),
            }
        }
        assert_eq!(Isa::parse("auto"), Ok(Isa::detect()));
        assert_eq!(Isa::parse(" Scalar "), Ok(Isa::Scalar));
        let e = Isa::parse("sse9").unwrap_err();
        assert!(e.contains("unknown level") && e.contains("scalar"), "{e}");
    }
}
