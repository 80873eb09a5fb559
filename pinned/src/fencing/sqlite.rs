//! [`FencedTable`]: a SQLite table of values fenced by placement epoch, on `rusqlite`.

use pinboard_protocol::worker::fencing::{Fence, FencedError, PADDED_WIDTH, StaleEpoch, sqlite};
use rusqlite::types::FromSqlError;
use rusqlite::{Connection, OptionalExtension, params};

/// A SQLite table `key TEXT PRIMARY KEY, value BLOB, epoch TEXT`, each value written with the
/// epoch of its writer and replaced only by a writer at that epoch or a higher one.
///
/// An epoch is stored as text, its digits zero-padded to 40
/// ([`Fence::padded`]): fixed-width digits compare as numbers under SQLite's `BINARY`
/// collation, at any size, where an `INTEGER` would overflow past 2^63 (the node promises only
/// "a decimal string"). A write is one statement, `INSERT … ON CONFLICT (key) DO UPDATE …
/// WHERE excluded.epoch >= epoch`, so two connections (threads, processes) cannot interleave
/// a check and a write: the higher epoch's value stands.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use pinned::fencing::FencedTable;
/// use pinned::{Fence, FencedError};
///
/// let conn = rusqlite::Connection::open("/var/lib/app/notes.db")?;
/// let notes = FencedTable::new("notes");
/// notes.create(&conn)?;
/// let fence = Fence::parse("1700000000123").unwrap(); // Fence::from(instance) in a request
/// match notes.write(&conn, "/threads/a", &fence, b"hello") {
///     Ok(()) => {}
///     // The instance moved on: this worker is a former owner, its write must not land.
///     Err(FencedError::Stale(stale)) => eprintln!("{stale}"),
///     Err(FencedError::Store(e)) => return Err(e.into()),
/// }
/// let (value, epoch) = notes.read(&conn, "/threads/a")?.expect("written");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FencedTable {
    create: String,
    write: String,
    read: String,
}

impl FencedTable {
    /// The table named `table` (any name: it is quoted).
    pub fn new(table: &str) -> FencedTable {
        FencedTable {
            create: sqlite::create(table),
            write: sqlite::write(table),
            read: sqlite::read(table),
        }
    }

    /// Creates the table when missing.
    pub fn create(&self, conn: &Connection) -> rusqlite::Result<()> {
        conn.execute(&self.create, []).map(drop)
    }

    /// Writes `key`'s value as the owner at `fence`: inserted for a new key, replaced while the
    /// stored epoch is at most `fence`, else refused ([`FencedError::Stale`], naming the
    /// stored epoch) and nothing changes.
    pub fn write(
        &self,
        conn: &Connection,
        key: &str,
        fence: &Fence,
        value: &[u8],
    ) -> Result<(), FencedError<rusqlite::Error>> {
        let padded = fence.padded().ok_or_else(|| {
            let wide = format!("epoch {fence} has more than {PADDED_WIDTH} digits");
            FencedError::Store(rusqlite::Error::ToSqlConversionFailure(wide.into()))
        })?;
        let written = conn
            .execute(&self.write, params![key, value, padded])
            .map_err(FencedError::Store)?;
        if written == 1 {
            return Ok(());
        }
        // Refused: the row holds a higher epoch (read after, so perhaps a higher one still:
        // epochs only grow).
        let stored = self.read(conn, key).map_err(FencedError::Store)?;
        let stored = stored.map(|(_, epoch)| epoch).unwrap_or_default();
        let offered = fence.clone();
        Err(StaleEpoch { stored, offered }.into())
    }

    /// `key`'s value and the epoch that wrote it, `None` for a key never written.
    pub fn read(&self, conn: &Connection, key: &str) -> rusqlite::Result<Option<(Vec<u8>, Fence)>> {
        conn.query_row(&self.read, [key], |row| {
            let epoch: String = row.get(1)?;
            let fence = Fence::parse(&epoch).ok_or_else(|| {
                let bad = FromSqlError::Other(format!("epoch {epoch:?} is not digits").into());
                rusqlite::Error::FromSqlConversionFailure(
                    1,
                    rusqlite::types::Type::Text,
                    bad.into(),
                )
            })?;
            Ok((row.get(0)?, fence))
        })
        .optional()
    }
}
