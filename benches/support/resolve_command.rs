//! The resolve EVALSHA's keys and arguments as `placement::resolve` sends them for a steady
//! request (`KEYS` 6, `ARGV` 12): one fixture for the encoding bench (`benches/resp_encode.rs`)
//! and the allocation test (`tests/alloc.rs`), which are separate crates.

pub const KEYS: [&[u8]; 6] = [
    b"pinboard:{7}:default:/threads:placements",
    b"pinboard:{7}:workers",
    b"pinboard:{7}:default:/threads:overwritten",
    b"pinboard:{7}:nsw:/threads",
    b"pinboard:{7}:boot_time",
    b"pinboard:{7}:epoch",
];

pub const ARGS: [&[u8]; 12] = [
    b"abc123",
    b"",
    b"15000",
    b"",
    b"",
    b"",
    b"2",
    b"[]",
    b"2715383210",
    b"1039870455",
    b"",
    b"0",
];
