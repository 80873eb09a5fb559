//! What the head targets (`http_head`, `response_head`) read from an input: byte 0 picks the
//! head size cap (16 to 4080 in steps of 16, or 255 for 64 KiB, the largest either decoder is
//! given), bytes 1-2 a split point, and the rest is what the peer sends; and the check both
//! make first, that a head decodes the same in one read as in two.

use bytes::BytesMut;

/// `(cap, split, wire)`: the split point is within `wire`. `None` for too short an input.
pub fn cap_split_wire(data: &[u8]) -> Option<(usize, usize, &[u8])> {
    let [cap, hi, lo, wire @ ..] = data else {
        return None;
    };
    let max = match cap {
        255 => 64 * 1024,
        small => 16 * (usize::from(*small) + 1),
    };
    let split = usize::from(u16::from_be_bytes([*hi, *lo])) % (wire.len() + 1);
    Some((max, split, wire))
}

/// Decodes `wire` with `run` in one read and again in two (split at `split`): both must give the
/// same outcome and leave the same bytes unread. Returns the one read's outcome and leftover,
/// and the two reads' outcome (its header maps are the caller's to give back).
pub fn whole_and_split<O: PartialEq + std::fmt::Debug>(
    wire: &[u8],
    split: usize,
    run: impl Fn(&[&[u8]]) -> (O, BytesMut),
) -> (O, BytesMut, O) {
    let (whole, leftover) = run(&[wire]);
    let (parted, parted_leftover) = run(&[&wire[..split], &wire[split..]]);
    assert_eq!(whole, parted, "split at {split} changed the outcome");
    assert_eq!(
        leftover, parted_leftover,
        "split at {split} changed the leftover"
    );
    (whole, leftover, parted)
}
