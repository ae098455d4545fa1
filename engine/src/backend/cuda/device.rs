//! One CUDA device: its context, the single stream every op is queued on, and the
//! kernel programs compiled by NVRTC to a CUBIN for this device's own architecture
//! (no PTX JIT, so the driver never sees PTX newer than it accepts).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

use super::probe::{Presence, Unavailable};
use super::programs::{self, Program};
use crate::error::{Error, Result};

/// Map a driver error to the crate's error, naming the operation.
pub(crate) fn drv(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda { op, reason: e.to_string() }
}

/// Options for every program: an exact (non-contracting) float model, matching the CPU.
const OPTIONS: [&str; 3] = ["--fmad=false", "--std=c++17", "-default-device"];

/// Compile `program` with NVRTC to a CUBIN for `arch` (e.g. `sm_90`). The caller must
/// have checked that libnvrtc is present (see `probe`). A compile error carries the log.
pub fn compile_cubin(program: &Program, arch: &str) -> Result<Vec<u8>> {
    let fail = |log: String| Error::CudaCompile { program: program.name.to_owned(), arch: arch.to_owned(), log };
    let src = CString::new(program.source()).map_err(|e| fail(e.to_string()))?;
    let name = CString::new(format!("{}.cu", program.name)).map_err(|e| fail(e.to_string()))?;
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| fail(e.to_string()))?;
    let mut opts: Vec<String> = OPTIONS.iter().map(|s| (*s).to_owned()).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` was created above and is destroyed exactly once, at the end.
    unsafe {
        let compiled = nvrtc::compile_program(prog, &opts);
        let out = match compiled {
            Err(e) => {
                let log = nvrtc::get_program_log(prog).map(|l| log_text(&l)).unwrap_or_default();
                Err(fail(format!("{e}\n{log}")))
            }
            Ok(()) => cubin(prog).map_err(|e| fail(e.to_string())),
        };
        let _ = nvrtc::destroy_program(prog);
        out
    }
}

/// # Safety
/// `prog` must be a live, successfully compiled program.
unsafe fn cubin(prog: nvrtc_sys::nvrtcProgram) -> std::result::Result<Vec<u8>, nvrtc::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: per the caller's contract; the buffer has the size NVRTC reported.
    unsafe {
        nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
        let mut buf = vec![0u8; size];
        nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()).result()?;
        Ok(buf)
    }
}

fn log_text(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A CUDA device ready to run the op kernels.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    arch: String,
    name: String,
    /// Streaming multiprocessors (flash-decoding sizes its splits by them).
    pub(crate) sms: usize,
    /// cuBLAS for prefill GEMMs, when the library is present.
    pub(crate) blas: Option<cudarc::cublas::CudaBlas>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    pub(crate) pinned: Mutex<super::download::Pinned>,
}

/// Device memory the pool keeps after it is freed (the default, 0, hands it back to the
/// driver at every synchronize, so each eager pass maps its activations anew).
const POOL_KEEP_BYTES: u64 = 1 << 30;

/// Keep up to `POOL_KEEP_BYTES` of freed memory in the device's default pool, which
/// stream-ordered allocations come from.
fn keep_pool(ctx: &CudaContext) -> Result<()> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut keep = POOL_KEEP_BYTES;
    // SAFETY: `pool` receives the device's default pool handle; the attribute takes a
    // pointer to a u64, which `keep` is.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result().map_err(drv("memory pool"))?;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        sys::cuMemPoolSetAttribute(pool, attr, (&mut keep as *mut u64).cast()).result().map_err(drv("memory pool"))
    }
}

impl Gpu {
    /// Open device `ordinal`: probe the libraries, create the context and stream, and
    /// compile and load every kernel program.
    pub fn open(ordinal: usize) -> Result<Self> {
        Presence::probe().decide(false)?;
        let count =
            CudaContext::device_count().map_err(|e| Unavailable::DriverUnusable(e.to_string()))?.max(0) as usize;
        if ordinal >= count {
            return Err(Unavailable::NoDevice { ordinal, count }.into());
        }
        let t = Instant::now();
        let ctx = CudaContext::new(ordinal).map_err(drv("create context"))?;
        // SAFETY: one stream only; nothing relies on cudarc's per-slice events.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("create stream"))?;
        keep_pool(&ctx)?;
        let (major, minor) = ctx.compute_capability().map_err(drv("compute capability"))?;
        let arch = format!("sm_{major}{minor}");
        let sm_attr = cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        let sms = ctx.attribute(sm_attr).map_err(drv("SM count"))?.max(1) as usize;
        // NVRTC compiles each program on its own thread (the GEMV program alone takes
        // seconds); loading stays on this one.
        let bins: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
            let jobs: Vec<_> = programs::ALL.iter().map(|p| s.spawn(|| compile_cubin(p, &arch))).collect();
            jobs.into_iter().map(|j| j.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
        });
        let mut modules = HashMap::new();
        for (p, bin) in programs::ALL.iter().zip(bins) {
            let module = ctx.load_module(Ptx::from_binary(bin?)).map_err(drv("load module"))?;
            modules.insert(p.name, module);
        }
        let name = ctx.name().unwrap_or_default();
        let blas = if Presence::probe().cublas {
            Some(
                cudarc::cublas::CudaBlas::new(stream.clone())
                    .map_err(|e| Error::Cuda { op: "cuBLAS", reason: e.to_string() })?,
            )
        } else {
            tracing::info!("libcublas.so.13 not found: prefill takes the MMQ kernel instead of f16 cuBLAS");
            None
        };
        tracing::info!(ordinal, device = %name, %arch, sms, ms = t.elapsed().as_millis() as u64, "CUDA device ready");
        let (functions, pinned) = (Mutex::new(HashMap::new()), Mutex::default());
        let gpu = Self { ctx, stream, arch, name, sms, blas, modules, functions, pinned };
        gpu.prepare_flash()?;
        Ok(gpu)
    }

    /// Open device 0, or say why not in one log line (the caller stays on the CPU).
    pub fn try_open_default() -> Option<Self> {
        match Self::open(0) {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::info!(reason = %e, "CUDA backend unavailable, using the CPU");
                None
            }
        }
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(drv("memory info"))
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// Kernel `name` of `program`, looked up once.
    pub(crate) fn function(&self, program: &Program, name: &'static str) -> Result<CudaFunction> {
        let mut cache = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = cache.get(name) {
            return Ok(f.clone());
        }
        let module = self
            .modules
            .get(program.name)
            .ok_or_else(|| Error::Cuda { op: "load function", reason: format!("no program {}", program.name) })?;
        let f = module.load_function(name).map_err(drv("load function"))?;
        cache.insert(name, f.clone());
        Ok(f)
    }

    /// Wait for every queued op.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv("synchronize"))
    }
}
