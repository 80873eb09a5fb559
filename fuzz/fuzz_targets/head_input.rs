//! What the head targets (`http_head`, `response_head`) read from an input: byte 0 picks the
//! head size cap (16 to 4080 in steps of 16, or 255 for 64 KiB, the largest either decoder is
//! given), bytes 1-2 a split point, and the rest is what the peer sends.

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
