//! What `/proc` says about a process: resident memory (now and its peak), open file
//! descriptors, bytes written, and the members of a process group. Linux only, like the
//! tests that use it.

#![allow(dead_code)]

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// The most resident memory the process has had.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM")
}

pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Bytes the process has written (`wchar` in `/proc/<pid>/io`).
pub fn bytes_written(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|io| io.lines().find_map(|l| l.strip_prefix("wchar:")?.trim().parse().ok()))
        .unwrap_or(0)
}

/// Live (not zombie) processes in process group `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for ent in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = ent.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // After the parenthesised name: state, ppid, pgrp, …
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" && fields[0] != "X" {
            out.push(pid);
        }
    }
    out
}
