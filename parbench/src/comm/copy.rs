//! The one memory copy of the host transports, their collectives and the
//! ladders that price them: in pieces of [`COPY_PIECE_BYTES`].
//!
//! Why pieces: glibc's `memcpy` picks its method by length, and on AMD it
//! stops using `rep movsb` above the core's L2 size (glibc 2.36's
//! `rep_movsb_stop_threshold`), falling back to a vector loop that ran
//! slower here at every length past it. Measured on the 2-core EPYC VM
//! (512 KiB L2, 32 MiB L3), both cores copying at once, 21 interleaved
//! samples: one `memcpy` of 1, 8, 32 and 128 MiB moved 52.8, 32.4, 11.5 and
//! 9.6 GB/s, the same bytes in 256 KiB pieces 64.8, 38.7, 14.1 and 11.7
//! (median ratio x1.20, x1.37, x1.24, x1.19); at 256 and 512 KiB the two
//! agree (x1.00, x1.01). A ring moves its blocks in slices of at most 512
//! KiB, so its rows copied in the fast regime while a ladder that copied
//! a whole rung in one call measured the slow one, and in-place all_gather
//! of 2-8 MiB ran 8-10% above its "ceiling". With one copy everywhere the
//! ceiling, the model's ladders and the rows see the same method.
//!
//! 256 KiB sits below the L2 of every x86 core this project runs on (AMD
//! Zen 512 KiB to 1 MiB, Intel 1-2 MiB), so each piece takes glibc's
//! short-copy path wherever that path is chosen by the L2 size.

/// Bytes per `memcpy` call of [`copy_bytes`].
pub const COPY_PIECE_BYTES: usize = 256 << 10;

/// Copies `src` into `dst` (of the same length) in pieces of
/// [`COPY_PIECE_BYTES`].
///
/// # Panics
/// When the lengths differ, as `copy_from_slice` does: every caller has
/// already matched them (a message's length is checked against its
/// receive buffer before the copy), so a difference is a bug here, not
/// bad input.
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    for (d, s) in dst
        .chunks_mut(COPY_PIECE_BYTES)
        .zip(src.chunks(COPY_PIECE_BYTES))
    {
        d.copy_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_byte_of_every_piece_and_the_tail() {
        for len in [
            0,
            1,
            COPY_PIECE_BYTES - 1,
            COPY_PIECE_BYTES,
            3 * COPY_PIECE_BYTES + 17,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let mut dst = vec![0u8; len];
            copy_bytes(&mut dst, &src);
            assert_eq!(dst, src, "length {len}");
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn refuses_buffers_of_different_lengths() {
        copy_bytes(&mut [0u8; 3], &[1u8; 4]);
    }
}
