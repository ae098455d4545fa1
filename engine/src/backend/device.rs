//! `--device auto|cpu|cuda[:N]`: which backend an engine runs on.

use std::fmt;
use std::str::FromStr;

/// The user's choice. `Auto` takes GPU 0 when a usable one is present, else the CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

/// What an engine actually runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda { ordinal: usize, name: String },
}

impl DeviceKind {
    /// `cpu` or `cuda:N` (as `/engine` and `/stats` report it).
    pub fn label(&self) -> String {
        match self {
            Self::Cpu => "cpu".into(),
            Self::Cuda { ordinal, .. } => format!("cuda:{ordinal}"),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| format!("unknown device {s:?}: expected auto, cpu, cuda or cuda:N")),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling_and_round_trips() {
        for (s, want) in [
            ("auto", DeviceChoice::Auto),
            ("cpu", DeviceChoice::Cpu),
            ("cuda", DeviceChoice::Cuda(0)),
            ("cuda:3", DeviceChoice::Cuda(3)),
        ] {
            let got: DeviceChoice = s.parse().unwrap();
            assert_eq!(got, want);
            assert_eq!(got.to_string().parse::<DeviceChoice>().unwrap(), want);
        }
        for bad in ["", "cuda:", "cuda:x", "metal", "CPU"] {
            assert!(bad.parse::<DeviceChoice>().is_err(), "{bad:?}");
        }
    }
}
