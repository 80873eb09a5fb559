//! Compare-and-set writes of placement rows that change an owner, a fence or a pause, and so
//! append to the ownership ledger in the same script: a release (`release.lua`: the worker's,
//! or the node's own for a forward that never reached its worker), an operator's wind-down or
//! move (`wind_down.lua`), and an operator's pause or resume of one id (`pause.lua`). Each is
//! one script call per bucket and per [`SCRIPT_PAGE`] rows, with the bucket's ledger keys
//! declared beside the rows' hashes.

use serde::Deserialize;

use super::records::{PlacementRow, lua_option};
use super::scripts::{PAUSE, RELEASE, WIND_DOWN};
use super::{KeyName, SCRIPT_PAGE, Store, bucket_of};
use crate::error::{Error, Origin};

/// A row to free, while it still belongs to `session_id` at `epoch` (`""`: an epoch-less row).
pub struct Release<'a> {
    pub env: &'a str,
    pub ns: &'a str,
    pub id: &'a str,
    pub session_id: &'a str,
    pub epoch: &'a str,
}

/// An operator's fence of rows: a wind-down's (seconds, `""` clears) or a move's, which also
/// names the successor session the next placement goes to (`""`: none, the normal choice).
pub struct Fence<'a> {
    pub deadline: &'a str,
    pub successor: &'a str,
    /// The operator's `sub`, which the ledger names as the fence's author.
    pub by: &'a str,
}

/// What an operator's pause or resume asks of one id's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pause<'a> {
    /// Pause, with the operator's reason (`""`: none given).
    Pause {
        reason: &'a str,
    },
    Resume,
}

/// What [`Store::pause`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum PauseOutcome {
    /// Paused or resumed, and appended to the ledger.
    Changed,
    /// Already so: nothing written.
    Unchanged,
    /// The row's owner is no longer the one read: nothing written.
    Stale,
}

/// A row a wind-down stamped: (id, its owner, the fence set, `None` for one cleared).
#[derive(Debug, Deserialize)]
pub struct Stamped(
    pub String,
    pub String,
    #[serde(deserialize_with = "lua_option")] pub Option<u64>,
);

impl Store {
    /// Frees those of `rows` (all of `bucket`) that still belong to the quoted session at the
    /// quoted epoch, [`SCRIPT_PAGE`] rows per script call: how many went.
    pub async fn release(&self, bucket: u32, rows: &[Release<'_>]) -> Result<u64, Error> {
        let mut freed = 0;
        for page in rows.chunks(SCRIPT_PAGE) {
            // The ledger's two keys, then each (env, ns)'s placements hash once; each row
            // names its hash by its (1-based) index in KEYS.
            let mut pairs: Vec<(&str, &str)> = Vec::new();
            let indexes: Vec<String> = page
                .iter()
                .map(|row| {
                    let pair = (row.env, row.ns);
                    let at = pairs.iter().position(|p| *p == pair).unwrap_or_else(|| {
                        pairs.push(pair);
                        pairs.len() - 1
                    });
                    (at + 3).to_string()
                })
                .collect();
            let hashes: Vec<KeyName> = pairs
                .iter()
                .map(|(env, ns)| self.keys.placements(bucket, env, ns))
                .collect();
            let mut keys: Vec<&[u8]> = self.ledger_keys(bucket).to_vec();
            keys.extend(hashes.iter().map(|key| key.as_bytes()));
            let mut args: Vec<&[u8]> = vec![self.ledger.as_bytes()];
            for (row, index) in page.iter().zip(&indexes) {
                let group = [index, row.env, row.ns, row.id, row.session_id, row.epoch];
                args.extend(group.map(str::as_bytes));
            }
            let released = self.run_int(&RELEASE, &keys, &args).await?;
            freed += u64::try_from(released).unwrap_or(0);
        }
        Ok(freed)
    }

    /// An operator's wind-down or move of `rows` ((id, sessionId, epoch) as read, at most
    /// [`SCRIPT_PAGE`]) of (env, ns) in `bucket`: each still as read gets the `fence` (and a
    /// move's successor, or none), and a ledger entry by the operator. The rows stamped.
    pub async fn wind_down(
        &self,
        bucket: u32,
        env: &str,
        ns: &str,
        fence: &Fence<'_>,
        rows: &[(&str, &str, &str)],
    ) -> Result<Vec<Stamped>, Error> {
        debug_assert!(rows.len() <= SCRIPT_PAGE);
        let placements = self.keys.placements(bucket, env, ns);
        let [ledger, last] = self.ledger_keys(bucket);
        let mut args: Vec<&[u8]> = vec![
            fence.deadline.as_bytes(),
            self.lease.as_bytes(),
            self.ledger.as_bytes(),
            env.as_bytes(),
            ns.as_bytes(),
            fence.by.as_bytes(),
            fence.successor.as_bytes(),
        ];
        for (id, session_id, epoch) in rows {
            args.extend([id.as_bytes(), session_id.as_bytes(), epoch.as_bytes()]);
        }
        self.run(&WIND_DOWN, &[placements.as_bytes(), ledger, last], &args)
            .await
    }
}

impl Store {
    /// An operator's pause or resume of `id` in (env, ns), by the operator `by`, while its row
    /// is still `read` (`None`: there was none): see `lua/pause.lua`.
    pub async fn pause(
        &self,
        env: &str,
        ns: &str,
        id: &str,
        read: Option<&PlacementRow>,
        ask: Pause<'_>,
        by: &str,
    ) -> Result<PauseOutcome, Error> {
        let bucket = bucket_of(id, self.keys.shards());
        let placements = self.keys.placements(bucket, env, ns);
        let [ledger, last] = self.ledger_keys(bucket);
        let owner = match read {
            None => "-",
            Some(row) => row.session_id.as_deref().unwrap_or(""),
        };
        let (op, reason) = match ask {
            Pause::Pause { reason } => ("pause", reason),
            Pause::Resume => ("resume", ""),
        };
        let args: [&[u8]; 8] = [
            op.as_bytes(),
            id.as_bytes(),
            owner.as_bytes(),
            self.ledger.as_bytes(),
            env.as_bytes(),
            ns.as_bytes(),
            by.as_bytes(),
            reason.as_bytes(),
        ];
        let reply = (self.redis)
            .evalsha(&PAUSE, &[placements.as_bytes(), ledger, last], &args)
            .await?;
        match reply.as_str() {
            Some("changed") => Ok(PauseOutcome::Changed),
            Some("unchanged") => Ok(PauseOutcome::Unchanged),
            Some("stale") => Ok(PauseOutcome::Stale),
            _ => Err(Error::new(
                Origin::Internal,
                format!("pause answered {reply:?}"),
            )),
        }
    }
}
