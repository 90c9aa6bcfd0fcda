//! WGSL kernel sources, one `.wgsl` file per kernel, exposed with `include_str!` (issue 5 adds them).
