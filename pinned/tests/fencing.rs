//! The fencing helpers against the real databases: [`FencedTable`] on a SQLite file (the
//! bundled SQLite, through `rusqlite`) and [`FencedRedis`] on a real `redis-server` started on
//! a free port. The same rules are checked on both — higher and equal epochs write, a lower
//! one is refused and changes nothing, epochs past 2^53 and 2^64 and of different lengths
//! compare as numbers, two writers at once end with the higher epoch's value — then what is
//! each one's own (the stored form, the errors).
//!
//! Needs the features: `cargo test -p pinned --features sqlite,redis --test fencing`.

mod support;

use std::path::Path;

use pinboard_protocol::worker::fencing::REDIS_COMPARE_AND_SET;
use pinned::fencing::{FencedRedis, FencedTable};
use pinned::{Fence, FencedError, StaleEpoch};
use support::redis::RedisServer;
use support::shuffled_epochs;

fn fence(digits: &str) -> Fence {
    Fence::parse(digits).unwrap()
}

/// One fenced store under test, through one connection; its errors as text.
trait Fenced: Send {
    fn write(&mut self, key: &str, fence: &Fence, value: &[u8]) -> Result<(), FencedError<String>>;
    fn read(&mut self, key: &str) -> Option<(Vec<u8>, Fence)>;
}

/// A helper's error with the store's own part as text.
fn texted<E: ToString>(error: FencedError<E>) -> FencedError<String> {
    match error {
        FencedError::Stale(stale) => FencedError::Stale(stale),
        FencedError::Store(e) => FencedError::Store(e.to_string()),
    }
}

struct Sqlite {
    conn: rusqlite::Connection,
    table: FencedTable,
}

impl Sqlite {
    fn open(file: &Path, table: &str) -> Sqlite {
        let conn = rusqlite::Connection::open(file).unwrap();
        let table = FencedTable::new(table);
        table.create(&conn).unwrap();
        Sqlite { conn, table }
    }
}

impl Fenced for Sqlite {
    fn write(&mut self, key: &str, at: &Fence, value: &[u8]) -> Result<(), FencedError<String>> {
        self.table.write(&self.conn, key, at, value).map_err(texted)
    }

    fn read(&mut self, key: &str) -> Option<(Vec<u8>, Fence)> {
        self.table.read(&self.conn, key).unwrap()
    }
}

struct Redis {
    conn: redis::Connection,
    helper: FencedRedis,
}

impl Redis {
    fn open(server: &RedisServer) -> Redis {
        let client = redis::Client::open(server.url()).unwrap();
        Redis {
            conn: client.get_connection().unwrap(),
            helper: FencedRedis::new(),
        }
    }
}

impl Fenced for Redis {
    fn write(&mut self, key: &str, at: &Fence, value: &[u8]) -> Result<(), FencedError<String>> {
        self.helper
            .write(&mut self.conn, key, at, value)
            .map_err(texted)
    }

    fn read(&mut self, key: &str) -> Option<(Vec<u8>, Fence)> {
        self.helper.read(&mut self.conn, key).unwrap()
    }
}

/// The refusal of a write from `offered` where `stored` is.
fn refused(result: Result<(), FencedError<String>>, stored: &str, offered: &str) {
    match result {
        Err(FencedError::Stale(stale)) => assert_eq!(
            stale,
            StaleEpoch {
                stored: fence(stored),
                offered: fence(offered)
            }
        ),
        other => panic!("{offered} after {stored} not refused as stale: {other:?}"),
    }
}

fn value_of(store: &mut dyn Fenced, key: &str) -> (String, String) {
    let (value, epoch) = store.read(key).expect("a written key");
    (String::from_utf8(value).unwrap(), epoch.to_string())
}

/// The rules every fenced store keeps.
fn keeps_the_fencing_rules(store: &mut dyn Fenced) {
    let pair = |v: &str, e: &str| (v.to_owned(), e.to_owned());
    assert_eq!(store.read("k"), None);
    store.write("k", &fence("5"), b"five").unwrap();
    assert_eq!(value_of(store, "k"), pair("five", "5"));
    // The same owner writes again; the next owner's higher epoch replaces it.
    store.write("k", &fence("5"), b"five again").unwrap();
    store.write("k", &fence("6"), b"six").unwrap();
    assert_eq!(value_of(store, "k"), pair("six", "6"));
    // A former owner's late write is refused and changes nothing.
    refused(store.write("k", &fence("5"), b"late"), "6", "5");
    assert_eq!(value_of(store, "k"), pair("six", "6"));
    let error = store.write("k", &fence("4"), b"later").unwrap_err();
    assert_eq!(error.to_string(), "stale epoch: stored 6, offered 4");

    // Keys are apart; a key's first write is taken at any epoch, 0 included.
    store.write("other", &fence("0"), b"zero").unwrap();
    assert_eq!(value_of(store, "other"), pair("zero", "0"));
    assert_eq!(value_of(store, "k"), pair("six", "6"));

    // Past 2^53 (2^53 + 1 is no float) and 2^64, and across lengths: as numbers, never as
    // floats or as text.
    let beyond = [
        ("9007199254740994", "9007199254740993"),
        ("18446744073709551616", "18446744073709551615"),
    ];
    for (higher, lower) in beyond {
        store
            .write("big", &fence(higher), higher.as_bytes())
            .unwrap();
        refused(store.write("big", &fence(lower), b"late"), higher, lower);
    }
    let top = "18446744073709551616";
    assert_eq!(value_of(store, "big"), pair(top, top));
    store.write("len", &fence("9"), b"nine").unwrap();
    store.write("len", &fence("10"), b"ten").unwrap();
    refused(store.write("len", &fence("9"), b"nine"), "10", "9");
    // "0010" is the epoch 10: equal, so it writes.
    store.write("len", &fence("0010"), b"ten again").unwrap();
    assert_eq!(value_of(store, "len"), pair("ten again", "10"));
    // Bytes, not text.
    store.write("bytes", &fence("1"), b"\0\xff\n").unwrap();
    assert_eq!(store.read("bytes").unwrap().0, b"\0\xff\n");
}

/// Two writers, each on its own connection, write one key at once, each its own epochs out of
/// order: the higher epoch's value stands, and every refusal named a higher stored epoch.
fn two_writers_end_with_the_highest_epoch(open: impl Fn() -> Box<dyn Fenced>) {
    let writers: Vec<_> = (0..2u64)
        .map(|writer| {
            let mut store = open();
            std::thread::spawn(move || {
                for epoch in shuffled_epochs(writer, 100) {
                    let at = fence(&epoch.to_string());
                    match store.write("race", &at, format!("{writer}:{epoch}").as_bytes()) {
                        Ok(()) => {}
                        Err(FencedError::Stale(stale)) => assert!(stale.stored > at, "{stale}"),
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let mut store = open();
    assert_eq!(
        value_of(store.as_mut(), "race"),
        ("1:200".to_owned(), "200".to_owned())
    );
}

#[test]
fn a_sqlite_table_keeps_the_fencing_rules() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.db");
    keeps_the_fencing_rules(&mut Sqlite::open(&file, "notes"));
    // What is on disk, read back by a new connection: the epoch zero-padded to 40 digits.
    let conn = rusqlite::Connection::open(&file).unwrap();
    let stored: String = conn
        .query_row("SELECT epoch FROM notes WHERE key = 'big'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(stored, format!("{:0>40}", "18446744073709551616"));
    two_writers_end_with_the_highest_epoch(|| Box::new(Sqlite::open(&file, "notes")));
}

#[test]
fn a_sqlite_table_refuses_what_it_cannot_store_exactly_and_quotes_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.db");
    let mut store = Sqlite::open(&file, "t\"; DROP TABLE x; --");
    store.write("k", &fence("7"), b"seven").unwrap();
    assert_eq!(value_of(&mut store, "k"), ("seven".into(), "7".into()));
    let tables: Vec<String> = store
        .conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(tables, ["t\"; DROP TABLE x; --"]);

    // 40 digits fit; 41 cannot be stored so that it compares exactly, and are not written.
    let widest = "9".repeat(40);
    store.write("k", &fence(&widest), b"widest").unwrap();
    let wider = format!("1{}", "0".repeat(40));
    match store.write("k", &fence(&wider), b"wider") {
        Err(FencedError::Store(e)) => assert!(e.contains("more than 40 digits"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(value_of(&mut store, "k"), ("widest".into(), widest));
}

#[test]
fn a_redis_key_keeps_the_fencing_rules() {
    let server = RedisServer::start();
    keeps_the_fencing_rules(&mut Redis::open(&server));
    // The layout: a hash of the value and the epoch's digits.
    assert_eq!(
        server.cli(&["HGET", "big", "epoch"]),
        "18446744073709551616"
    );
    assert_eq!(
        server.cli(&["HGET", "big", "value"]),
        "18446744073709551616"
    );
    two_writers_end_with_the_highest_epoch(|| Box::new(Redis::open(&server)));
}

#[test]
fn the_redis_script_is_run_by_its_digest_and_refuses_a_malformed_epoch() {
    let server = RedisServer::start();
    let mut store = Redis::open(&server);
    store.write("k", &fence("3"), b"three").unwrap();
    let sha = server.cli(&["SCRIPT", "LOAD", REDIS_COMPARE_AND_SET]);
    // Loaded by the helper's first write (EVAL after EVALSHA missed), then run by digest.
    server.cli(&["SCRIPT", "FLUSH"]);
    store.write("k", &fence("4"), b"four").unwrap();
    assert_eq!(server.cli(&["SCRIPT", "EXISTS", &sha]), "1");
    assert_eq!(value_of(&mut store, "k"), ("four".into(), "4".into()));

    // Straight through EVALSHA as any client would: the answers, and what is not an epoch.
    let eval = |epoch: &str, value: &str| server.cli(&["EVALSHA", &sha, "1", "k", epoch, value]);
    assert_eq!(eval("3", "late"), "0\n4");
    assert_eq!(eval("0005", "five"), "1\n5");
    for bad in ["", "x", "-6", "6.0", "6 ", "+6"] {
        assert_eq!(eval(bad, "bad"), "ERR malformed epoch", "{bad:?}");
    }
    assert_eq!(value_of(&mut store, "k"), ("five".into(), "5".into()));
    // A key that is not such a hash is the store's error, not a refusal.
    server.cli(&["SET", "plain", "x"]);
    match store.write("plain", &fence("1"), b"v") {
        Err(FencedError::Store(e)) => assert!(e.contains("WRONGTYPE"), "{e}"),
        other => panic!("{other:?}"),
    }
}
