//! Which CUDA libraries this machine has, checked before cudarc touches any of them
//! (cudarc panics on a missing library). The decision is a pure function of what was
//! found, so it is tested with plain values.

use std::fmt;

/// A shared library the CUDA backend loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// `libcuda.so.1`: the NVIDIA driver.
    Driver,
    /// `libnvrtc.so.13`: the runtime compiler for the kernels (CUDA 13 toolkit or the
    /// `nvidia-cuda-nvrtc` wheel).
    Nvrtc,
    /// `libcublas.so.13`: the f16 prefill GEMMs (without it, prefill takes MMQ).
    Cublas,
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Library::Driver => "libcuda.so.1 (NVIDIA driver)",
            Library::Nvrtc => "libnvrtc.so.13 (CUDA 13 NVRTC)",
            Library::Cublas => "libcublas.so.13 (CUDA 13 cuBLAS)",
        })
    }
}

/// Why the CUDA backend cannot run here.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("{0} not found on the library path")]
    Missing(Library),
    #[error("no CUDA device {ordinal} (the driver reports {count})")]
    NoDevice { ordinal: usize, count: usize },
    /// The driver library loads but cannot initialize (no GPU, driver too old).
    #[error("the CUDA driver cannot initialize: {0}")]
    DriverUnusable(String),
}

/// What a probe found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Presence {
    pub driver: bool,
    pub nvrtc: bool,
    pub cublas: bool,
}

impl Presence {
    /// Look for each library with the same candidate names cudarc will load.
    pub fn probe() -> Self {
        // SAFETY: these only try to dlopen the library by name and drop the handle.
        unsafe {
            Self {
                driver: cudarc::driver::sys::is_culib_present(),
                nvrtc: cudarc::nvrtc::sys::is_culib_present(),
                cublas: cudarc::cublas::sys::is_culib_present(),
            }
        }
    }

    /// Whether the op kernels can run (driver to run them, NVRTC to build them), and
    /// if not the first missing library. `needs_cublas` for paths that call cuBLAS.
    pub fn decide(self, needs_cublas: bool) -> Result<(), Unavailable> {
        if !self.driver {
            return Err(Unavailable::Missing(Library::Driver));
        }
        if !self.nvrtc {
            return Err(Unavailable::Missing(Library::Nvrtc));
        }
        if needs_cublas && !self.cublas {
            return Err(Unavailable::Missing(Library::Cublas));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_names_the_first_missing_library() {
        let all = Presence { driver: true, nvrtc: true, cublas: true };
        assert_eq!(all.decide(true), Ok(()));
        assert_eq!(Presence { cublas: false, ..all }.decide(false), Ok(()));
        assert_eq!(Presence { cublas: false, ..all }.decide(true), Err(Unavailable::Missing(Library::Cublas)));
        assert_eq!(Presence { nvrtc: false, ..all }.decide(false), Err(Unavailable::Missing(Library::Nvrtc)));
        assert_eq!(Presence::default().decide(false), Err(Unavailable::Missing(Library::Driver)));
        let msg = Unavailable::Missing(Library::Nvrtc).to_string();
        assert!(msg.contains("libnvrtc.so.13"), "{msg}");
    }
}
