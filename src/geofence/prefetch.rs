//! A hint to start loading a cache line now, for a batch that knows its
//! next addresses before it can use them (`FenceIndex::containing_batch`).

/// Asks the CPU to bring the line holding `value` into cache. Only a hint:
/// it changes no value, and where there is no such instruction it does
/// nothing.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    prefetch_address(std::ptr::from_ref(value).cast());
}

#[inline(always)]
fn prefetch_address(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and cannot fault,
    // whatever the address (callers pass addresses within a live value or
    // slice); the SSE it needs is part of the x86_64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(address.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Bytes in a cache line on the CPUs we run on.
const LINE: usize = 64;

/// [`prefetch`] for every line `items` spans.
#[inline]
pub fn prefetch_lines<T>(items: &[T]) {
    let bytes = std::mem::size_of_val(items);
    let start: *const u8 = items.as_ptr().cast();
    let mut offset = 0;
    while offset < bytes {
        prefetch_address(start.wrapping_add(offset));
        offset += LINE;
    }
    if bytes > 0 {
        // The last line, when the slice does not start on a line boundary.
        prefetch_address(start.wrapping_add(bytes - 1));
    }
}
