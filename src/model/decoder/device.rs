//! Where a model runs (`cpu`, `cuda:N`, `metal:N`) and which forward runs it there.
//!
//! Why it exists: the own CPU kernels are the fast, batch-invariant path on a CPU, and candle's
//! tensors are the only path on a GPU. A user names a device and, optionally, a backend; this
//! module turns the pair into an opened candle `Device` and a [`ForwardKind`], and words the
//! start-up errors for a device that is not there or a feature this build lacks, naming both.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use crate::model::{ModelError, Result};

/// A device as the user names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
    Metal(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let lower = s.trim().to_ascii_lowercase();
        let (kind, ordinal) = match lower.split_once(':') {
            Some((k, n)) => {
                let n = n
                    .parse::<usize>()
                    .map_err(|_| format!("bad device ordinal in {s:?} (expected e.g. cuda:0)"))?;
                (k.to_string(), Some(n))
            }
            None => (lower.clone(), None),
        };
        match (kind.as_str(), ordinal) {
            ("cpu", None) => Ok(Self::Cpu),
            ("cuda", n) => Ok(Self::Cuda(n.unwrap_or(0))),
            ("metal", n) => Ok(Self::Metal(n.unwrap_or(0))),
            _ => Err(format!(
                "unknown device {s:?} (expected cpu, cuda, cuda:N, metal or metal:N)"
            )),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::Metal(n) => write!(f, "metal:{n}"),
        }
    }
}

impl DeviceSpec {
    /// Opens the device; a GPU this build cannot drive, or one that is not there, is an error
    /// that names the device and the reason.
    pub fn open(self) -> Result<Device> {
        let (compiled, feature) = match self {
            Self::Cpu => return Ok(Device::Cpu),
            Self::Cuda(_) => (candle_core::utils::cuda_is_available(), "cuda"),
            Self::Metal(_) => (candle_core::utils::metal_is_available(), "metal"),
        };
        if !compiled {
            return Err(ModelError::Device(format!(
                "device `{self}` needs a tandem built with the `{feature}` feature \
                 (cargo build --release --features {feature}); this build has no {} support",
                feature.to_uppercase()
            )));
        }
        let opened = match self {
            Self::Cuda(n) => Device::new_cuda(n),
            Self::Metal(n) => Device::new_metal(n),
            Self::Cpu => unreachable!("returned above"),
        };
        // The first line only: candle's errors may carry a backtrace after it.
        opened.map_err(|e| {
            let e = e.to_string();
            let reason = e.lines().next().unwrap_or_default().trim();
            ModelError::Device(format!("device `{self}` is not available: {reason}"))
        })
    }
}

/// Which forward the user asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The own kernels on a CPU, candle's tensors elsewhere.
    #[default]
    Auto,
    /// The own CPU kernels (CPU only).
    Own,
    /// candle's tensors, on any device (on a CPU too).
    Candle,
}

impl FromStr for BackendChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "own" | "cpu-kernels" => Ok(Self::Own),
            "candle" | "tensor" => Ok(Self::Candle),
            _ => Err(format!(
                "unknown backend {s:?} (expected auto, own or candle)"
            )),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Own => "own",
            Self::Candle => "candle",
        })
    }
}

/// The forward a model instance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardKind {
    /// The own batch-invariant CPU kernels.
    Own,
    /// candle tensors on the model's device.
    Tensor,
}

impl fmt::Display for ForwardKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Own => "own CPU kernels",
            Self::Tensor => "candle tensors",
        })
    }
}

impl BackendChoice {
    /// The forward for `device`: the own kernels run on a CPU only.
    pub fn resolve(self, device: DeviceSpec) -> std::result::Result<ForwardKind, String> {
        match (self, device) {
            (Self::Auto, DeviceSpec::Cpu) | (Self::Own, DeviceSpec::Cpu) => Ok(ForwardKind::Own),
            (Self::Auto, _) | (Self::Candle, _) => Ok(ForwardKind::Tensor),
            (Self::Own, d) => Err(format!(
                "the own kernels run on the CPU only; device `{d}` needs backend `candle` (or auto)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print_back() {
        for (s, want) in [
            ("cpu", DeviceSpec::Cpu),
            ("CUDA", DeviceSpec::Cuda(0)),
            ("cuda:1", DeviceSpec::Cuda(1)),
            ("metal", DeviceSpec::Metal(0)),
        ] {
            let d: DeviceSpec = s.parse().unwrap();
            assert_eq!(d, want);
            assert_eq!(d.to_string().parse::<DeviceSpec>().unwrap(), d);
        }
        for bad in ["gpu", "cuda:x", "cpu:1", ""] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(e.contains("device"), "{e}");
        }
    }

    #[test]
    fn the_own_kernels_stay_on_the_cpu() {
        assert_eq!(
            BackendChoice::Auto.resolve(DeviceSpec::Cpu),
            Ok(ForwardKind::Own)
        );
        assert_eq!(
            BackendChoice::Candle.resolve(DeviceSpec::Cpu),
            Ok(ForwardKind::Tensor)
        );
        assert_eq!(
            BackendChoice::Auto.resolve(DeviceSpec::Cuda(0)),
            Ok(ForwardKind::Tensor)
        );
        let e = BackendChoice::Own.resolve(DeviceSpec::Cuda(0)).unwrap_err();
        assert!(e.contains("cuda:0") && e.contains("candle"), "{e}");
        assert!("fast".parse::<BackendChoice>().is_err());
    }

    #[test]
    fn a_gpu_this_build_lacks_is_a_clear_error() {
        let opened = DeviceSpec::Cuda(0).open();
        if candle_core::utils::cuda_is_available() {
            // A CUDA build: either the GPU is there, or the error says it is not.
            if let Err(e) = opened {
                assert!(e.to_string().contains("`cuda:0` is not available"), "{e}");
            }
        } else {
            let e = opened.unwrap_err().to_string();
            assert!(e.contains("cuda:0") && e.contains("--features cuda"), "{e}");
        }
    }
}
