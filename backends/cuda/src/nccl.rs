//! Tensor parallelism on CUDA: NCCL all-reduces on the compute stream (cudarc's `nccl`), the
//! communicator built from an id rank 0 draws and the process group (MPI) broadcasts, as
//! NCCL's own multi-process example does.

use std::sync::{Arc, Mutex};

use cudarc::nccl::{Comm, Id, ReduceOp};
use infer_core::BackendError;
use infer_core::{InferError, ProcessGroup};

use crate::error::CudaError;

/// Refuses, with what to do, where NCCL cannot be loaded (cudarc would panic on first use).
pub fn check_nccl() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library by cudarc's names; loads nothing into CUDA.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Ok(());
    }
    // SAFETY: opening a shared library runs its initializers; NCCL's only set up state.
    let wheel_only = unsafe { libloading::Library::new("libnccl.so.2") }.is_ok();
    Err(CudaError::Unavailable(if wheel_only {
        "NCCL is installed as libnccl.so.2 (its PyPI wheel) but cudarc opens libnccl.so: put a libnccl.so symlink to it in a directory on LD_LIBRARY_PATH (scripts/fetch-nccl.sh does this)".into()
    } else {
        "libnccl.so not found: tensor parallelism on CUDA needs NCCL (`pip install nvidia-nccl-cu12`, or scripts/fetch-nccl.sh, and its lib directory on LD_LIBRARY_PATH)".into()
    }))
}

/// One rank's NCCL communicator.
pub struct NcclComm {
    /// SAFETY (Send/Sync below): an NCCL communicator may be used from any thread as long as
    /// calls on it do not overlap; the mutex serializes them.
    comm: Mutex<Comm>,
}

// SAFETY: see the `comm` field.
unsafe impl Send for NcclComm {}
// SAFETY: see the `comm` field.
unsafe impl Sync for NcclComm {}

fn nccl_err(what: &str, e: cudarc::nccl::result::NcclError) -> CudaError {
    BackendError::device("nccl", format!("{what}: {:?}", e.0)).into()
}

impl NcclComm {
    /// Joins the group's NCCL communicator on `stream` (every rank calls this together).
    pub fn new(
        stream: Arc<cudarc::driver::CudaStream>,
        group: &dyn ProcessGroup,
    ) -> infer_core::Result<Self> {
        // Rank 0 must not draw an id it cannot use; the others learn of it from the launcher
        // when rank 0 exits.
        check_nccl()?;
        let id = if group.rank() == 0 {
            Some(Id::new().map_err(|e| nccl_err("ncclGetUniqueId", e))?)
        } else {
            None
        };
        let bytes: Option<Vec<u8>> = id.map(|id| id.internal().iter().map(|&c| c as u8).collect());
        let bytes = group.broadcast(bytes.as_deref(), false)?;
        let internal: [std::ffi::c_char; 128] =
            std::array::from_fn(|i| bytes.get(i).copied().unwrap_or(0) as std::ffi::c_char);
        if bytes.len() != 128 {
            return Err(InferError::Distributed(format!(
                "the NCCL id from rank 0 has {} bytes, not 128",
                bytes.len()
            )));
        }
        let comm = Comm::from_rank(stream, group.rank(), group.size(), Id::uninit(internal))
            .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        Ok(NcclComm {
            comm: Mutex::new(comm),
        })
    }

    /// Sums `buf` over the ranks in place, enqueued on the compute stream.
    pub fn all_reduce_sum(
        &self,
        buf: &mut cudarc::driver::CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let comm = self
            .comm
            .lock()
            .map_err(|_| CudaError::Unavailable("the NCCL communicator lock is poisoned".into()))?;
        comm.all_reduce_in_place(buf, &ReduceOp::Sum)
            .map(drop)
            .map_err(|e| nccl_err("ncclAllReduce", e))
    }
}
