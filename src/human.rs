//! How figures read for a person in the client verbs' output: spans of time, byte sizes
//! and counts. Pure.

use std::time::Duration;

/// `0.4s`, `9.8s`, `42s`, `3m 12s`, `2h 5m`, `4d 3h`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        return format!("{s:.1}s");
    }
    let s = d.as_secs();
    let (m, h, days) = (s / 60, s / 3600, s / 86400);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{m}m {}s", s % 60),
        3600..86400 => format!("{h}h {}m", m % 60),
        _ => format!("{days}d {}h", h % 24),
    }
}

/// Binary units: `512 B`, `1.5 KiB`, `91.2 MiB`, `8.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Thousands separated by commas: `12,345`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `1 request`, `2 requests`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_keep_two_units_at_most() {
        let s = Duration::from_secs;
        assert_eq!(duration(Duration::from_millis(430)), "0.4s");
        assert_eq!(duration(Duration::from_millis(9_840)), "9.8s");
        assert_eq!(duration(s(42)), "42s");
        assert_eq!(duration(s(192)), "3m 12s");
        assert_eq!(duration(s(2 * 3600 + 5 * 60 + 59)), "2h 5m");
        assert_eq!(duration(s(4 * 86400 + 3 * 3600)), "4d 3h");
    }

    #[test]
    fn sizes_use_binary_units_and_counts_commas() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(95_632_384), "91.2 MiB");
        assert_eq!(bytes(8 << 30), "8.0 GiB");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(12_345_678), "12,345,678");
        assert_eq!(plural(1, "crash", "crashes"), "1 crash");
        assert_eq!(plural(1200, "crash", "crashes"), "1,200 crashes");
    }
}
