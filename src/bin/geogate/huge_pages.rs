//! Transparent huge pages off for this process, unless mimalloc's own
//! switch asks to keep them.
//!
//! With THP on, the first touch of each fresh 2 MiB region zeroes all of
//! it: a freshly started geogate draining a backlog spent 15% of its
//! samples in the kernel zeroing pages. Off, its CPU per message fell by
//! about 10% (7–15% over three sets) while the steady-state pipeline and
//! containment were level (docs/decisions/0008-transparent-huge-pages-off.md).

use std::ffi::OsString;

/// mimalloc's switch, read as mimalloc reads it: the name in any case.
const SWITCH: &str = "MIMALLOC_ALLOW_THP";

/// Whether the environment keeps huge pages on: `MIMALLOC_ALLOW_THP` set to
/// a value mimalloc takes as true (empty, true, yes, on, or a number other
/// than 0, leading blanks allowed). `0`, false, no and off turn them off,
/// as mimalloc itself then does. A value mimalloc cannot read leaves
/// geogate's default (off), where mimalloc alone would keep them on.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub fn kept_on(vars: impl IntoIterator<Item = (OsString, OsString)>) -> bool {
    vars.into_iter()
        .find(|(name, _)| {
            name.to_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(SWITCH))
        })
        .is_some_and(|(_, value)| {
            let value = value.to_string_lossy().trim_start().to_ascii_uppercase();
            let digits = value.strip_prefix(['-', '+']).unwrap_or(&value);
            matches!(value.as_str(), "" | "TRUE" | "YES" | "ON")
                || (!digits.is_empty()
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && digits.bytes().any(|b| b != b'0'))
        })
}

/// Turns huge pages off unless [`kept_on`]. Best effort: a kernel without
/// the call (before 3.15) keeps its default, and says so on stderr.
pub fn keep_off_unless_asked() {
    #[cfg(target_os = "linux")]
    if !kept_on(std::env::vars_os()) {
        use libc::{PR_SET_THP_DISABLE, c_int, c_ulong, prctl};
        // SAFETY: prctl reads its four further arguments as unsigned longs,
        // which they are, and PR_SET_THP_DISABLE only sets a flag on this
        // process's memory map: no memory of ours is read or written.
        let done: c_int = unsafe {
            prctl(
                PR_SET_THP_DISABLE,
                1 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
            )
        };
        if done != 0 {
            eprintln!(
                "geogate: could not turn transparent huge pages off ({}); running with the kernel's setting",
                std::io::Error::last_os_error()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kept_on;

    fn env(pairs: &[(&str, &str)]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn only_a_true_switch_keeps_huge_pages() {
        assert!(!kept_on(env(&[])));
        assert!(!kept_on(env(&[("PATH", "/bin")])));
        for on in [
            "1",
            "2",
            "-1",
            " 1",
            "99999999999999999999",
            "true",
            "YES",
            "On",
            "",
        ] {
            assert!(kept_on(env(&[("MIMALLOC_ALLOW_THP", on)])), "{on:?}");
        }
        for off in ["0", "00", "false", "no", "off", "2x", "-"] {
            assert!(!kept_on(env(&[("MIMALLOC_ALLOW_THP", off)])), "{off:?}");
        }
        assert!(kept_on(env(&[("mimalloc_allow_thp", "1")])));
    }
}
