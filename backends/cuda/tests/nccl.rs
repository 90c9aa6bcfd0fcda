//! NCCL's all-reduce as the CUDA backend's `all_reduce_sum`, at world size 1: a lent machine
//! has one GPU, and NCCL refuses two ranks on one GPU. The communicator is built from an id
//! handed over through the process group, and the sum over one rank is its input, bit for
//! bit. Skipped (saying so) without a GPU; where there is one, a missing NCCL fails the test.

mod common;

use common::gpu;
use infer_core::{Backend, HostTensor, ProcessGroup, Result};
use infer_cuda::CudaWeights;
use infer_tests::gguf_writer::random_values;

/// A group of one process: what `--distributed-executor-backend mp -tp 1` makes.
struct OneRank;

impl ProcessGroup for OneRank {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn broadcast(&self, data: Option<&[u8]>, _idle: bool) -> Result<Vec<u8>> {
        Ok(data.unwrap_or_default().to_vec())
    }
    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_min(&self, value: u64) -> Result<u64> {
        Ok(value)
    }
    fn describe(&self) -> String {
        "one rank".into()
    }
}

#[test]
fn a_one_rank_nccl_all_reduce_returns_its_input() {
    let Some(g) = gpu(CudaWeights::F32) else {
        return;
    };
    let g = g
        .with_group(&OneRank)
        .expect("joining NCCL (libnccl.so on LD_LIBRARY_PATH: scripts/fetch-nccl.sh)");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    // An o_proj output of 7 tokens, and one larger than NCCL's internal chunks.
    for (rows, cols) in [(7, 576), (1024, 4096)] {
        let data = random_values(rows * cols, seed ^ rows as u64, 3.0);
        let mut x = g
            .upload(&HostTensor::new(vec![rows, cols], data.clone()))
            .unwrap();
        g.all_reduce_sum(&mut x).unwrap();
        assert_eq!(g.to_host(&x).unwrap().data, data, "{rows}x{cols}");
    }
}
