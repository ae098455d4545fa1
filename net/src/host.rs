//! Facts about the machine the servers run on.

/// Physical memory in bytes, if the platform says.
pub fn physical_memory_bytes() -> Option<u64> {
    use nix::unistd::{SysconfVar, sysconf};
    let pages = sysconf(SysconfVar::_PHYS_PAGES).ok().flatten()?;
    let page = sysconf(SysconfVar::PAGE_SIZE).ok().flatten()?;
    u64::try_from(pages).ok()?.checked_mul(u64::try_from(page).ok()?)
}

/// The default memory budget: 0.75 × physical memory (8 GB where it is unknown).
pub fn default_memory_budget() -> u64 {
    physical_memory_bytes().map_or(8_000_000_000, |b| b / 4 * 3)
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_machine_has_memory() {
        let b = super::physical_memory_bytes().expect("known on Linux and macOS");
        assert!(b > 256 << 20, "{b}");
        assert_eq!(super::default_memory_budget(), b / 4 * 3);
    }
}
