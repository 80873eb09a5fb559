//! The resolve EVALSHA's keys and arguments as `placement::resolve` sends them for a steady
//! request (`KEYS` 9, `ARGV` 3): one fixture for the encoding bench (`benches/resp_encode.rs`)
//! and the allocation test (`tests/alloc.rs`), which are separate crates.

/// How many keys the resolve script declares.
pub const KEYS: usize = 9;

/// The keys, named by the store as the node names them (bucket 7 of 16, `/threads`).
pub fn keys() -> [String; KEYS] {
    let keys = pinboard::store::Keys::new("pinboard:", 16);
    let fixed = keys.bucket(7);
    [
        keys.placements(7, "default", "/threads").to_string(),
        fixed.workers.clone(),
        keys.overwritten(7, "default", "/threads").to_string(),
        keys.nsw(7, "", "/threads").to_string(),
        fixed.boot_time.clone(),
        fixed.epoch.clone(),
        fixed.alive.clone(),
        fixed.ledger.clone(),
        fixed.ledger_last.clone(),
    ]
}

pub const ARGS: [&[u8]; 3] = [
    b"abc123",
    b"",
    b"15000\n2\n\n\n\n[]\n2715383210\n1039870455\n\n0\n0\n\n100000\ndefault\n/threads",
];
