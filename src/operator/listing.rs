//! The placements `GET /registry/overview` lists for one (env, namespace) — the live ones, and
//! every paused id, placed or not, so that an operator can find it to resume it — read a page
//! (`HSCAN … COUNT 250`, paced: the walk waits between pages as long as a page takes) at a
//! time and written out in id order, at a cost that stays small per page whatever the
//! namespace's size.
//!
//! Each page's kept rows become a run: their ids, tags and hostnames back to back in one
//! string, the rest in a small record (the owner as an index into the live sessions), the run
//! sorted by id. Writing merges the runs (a heap of one cursor per run) and yields to the
//! core's other tasks every page of entries. No tree of a million ids is built, and a page
//! allocates a handful of buffers, not a few per row.
//!
//! The answer ([`Body`]) goes out as it is written: to an HTTP/1.1 GET as a chunked body,
//! 64 KiB a chunk, each write letting the core's other requests in (and pacing the listing to
//! what the client reads); to HEAD or HTTP/1.0 whole, with a length. A million entries are
//! some 65 MB: built whole and copied onto the connection at once, they held the core for
//! 150 ms.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;
use std::task::Poll;

use ahash::AHashMap;
use bytes::Bytes;
use http::StatusCode;
use http::header::{CONTENT_TYPE, DATE};

use crate::error::Error;
use crate::http::{BodyFraming, Persistence, Request, Response, current_date};
use crate::store::{PlacementRow, Store};

/// How many entries are written between two pauses of the writer.
const BETWEEN_PAUSES: usize = 256;
/// A streamed body goes out in chunks of about this many bytes.
const CHUNK: usize = 64 * 1024;

/// The live sessions, by id: a row's owner is kept as its index here.
pub struct Owners<'a> {
    index: AHashMap<&'a str, u32>,
    /// Each session's id as a JSON string.
    json: Vec<Vec<u8>>,
}

impl<'a> Owners<'a> {
    pub fn new(ids: impl Iterator<Item = &'a str>) -> Owners<'a> {
        let mut owners = Owners {
            index: AHashMap::new(),
            json: Vec::new(),
        };
        for id in ids {
            if !owners.index.contains_key(id) {
                owners.index.insert(id, owners.json.len() as u32);
                owners.json.push(json_string(id));
            }
        }
        owners
    }
}

/// What a listing keeps: the rows whose owner is live and whose fence has not passed at `now`
/// (ms), and the paused rows, whoever owns them (a paused placeholder has no owner); of those,
/// the ids starting with `prefix` and the rows tagged `tag`.
pub struct Keep<'f> {
    pub now: u64,
    pub prefix: Option<&'f str>,
    pub tag: Option<&'f str>,
}

impl Keep<'_> {
    /// When the row is kept, its owner as listed: the owner's index in `owners`, or `None`
    /// for a paused row whose owner is gone (or that has none).
    pub fn owner(&self, id: &str, row: &PlacementRow, owners: &Owners<'_>) -> Option<Option<u32>> {
        let filtered = self.prefix.is_none_or(|p| id.starts_with(p))
            && self.tag.is_none_or(|t| row.tag.as_deref() == Some(t));
        if !filtered {
            return None;
        }
        let owner = row.owner().and_then(|s| owners.index.get(s).copied());
        if row.paused.is_some() {
            return Some(owner);
        }
        owner.filter(|_| !row.fenced(self.now)).map(Some)
    }
}

/// The kept placements of one (env, ns), in sorted runs.
#[derive(Default)]
pub struct Listing {
    runs: Vec<Run>,
    entries: usize,
    text: usize,
}

#[derive(Default)]
struct Run {
    text: String,
    kept: Vec<Kept>,
}

struct Kept {
    id: Range<u32>,
    /// `None`: a paused row without a live owner.
    owner: Option<u32>,
    expiry: Option<u64>,
    tag: Option<Range<u32>>,
    hostname: Option<Range<u32>>,
    /// The pause as JSON.
    paused: Option<Range<u32>>,
}

impl Run {
    fn push(&mut self, s: &str) -> Range<u32> {
        let start = self.text.len() as u32;
        self.text.push_str(s);
        start..self.text.len() as u32
    }

    fn at(&self, span: &Range<u32>) -> &str {
        &self.text[span.start as usize..span.end as usize]
    }

    fn id(&self, i: usize) -> &str {
        self.at(&self.kept[i].id)
    }
}

impl Listing {
    /// Reads the placements of (env, ns) a page at a time and keeps the live ones `keep`
    /// allows. An id HSCAN hands out twice is listed once, as last read.
    pub async fn read(
        store: &Store,
        env: &str,
        ns: &str,
        owners: &Owners<'_>,
        keep: &Keep<'_>,
    ) -> Result<Listing, Error> {
        let mut listing = Listing::default();
        let mut pages = store.row_pages(env, ns, keep.prefix).paced();
        while let Some(page) = pages.next().await? {
            let mut run = Run {
                text: String::new(),
                kept: Vec::with_capacity(page.entries.len()),
            };
            for (id, row) in &page.entries {
                let Some(owner) = keep.owner(id, row, owners) else {
                    continue;
                };
                let id = run.push(id);
                let tag = row.tag.as_deref().map(|t| run.push(t));
                let hostname = row.hostname.as_deref().map(|h| run.push(h));
                let paused = (row.paused.as_ref())
                    .map(|p| run.push(&serde_json::to_string(p).expect("a pause serializes")));
                run.kept.push(Kept {
                    id,
                    owner,
                    expiry: row.expiry,
                    tag,
                    hostname,
                    paused,
                });
            }
            if run.kept.is_empty() {
                continue;
            }
            // Stable: of two reads of one id in a page, the later stays later.
            let Run { text, kept } = &mut run;
            kept.sort_by(|a, b| {
                let at = |s: &Range<u32>| &text[s.start as usize..s.end as usize];
                at(&a.id).cmp(at(&b.id))
            });
            listing.entries += run.kept.len();
            listing.text += run.text.len();
            listing.runs.push(run);
        }
        Ok(listing)
    }

    /// About how many bytes [`Listing::write`] appends.
    pub fn size_hint(&self) -> usize {
        self.text + self.entries * 64
    }

    /// Appends the entries, comma-separated, in id order — `{expiry?, id, paused?, sessionId,
    /// tag?}`, keys sorted as serde_json writes an object, `sessionId` null for a paused row
    /// without a live owner — keeping only rows of `hostname` when one is given (a paused row
    /// with no live owner and no hostname, under every hostname). Pauses
    /// ([`Body::pause`]) every 256 entries.
    pub async fn write(&self, hostname: Option<&str>, owners: &Owners<'_>, out: &mut Body<'_, '_>) {
        let runs = &self.runs;
        // The next entry of each run, smallest id first; of equal ids, the earlier run (page)
        // first, so the last one popped is the last read.
        let mut heap: BinaryHeap<Reverse<(&str, usize, usize)>> = runs
            .iter()
            .enumerate()
            .map(|(r, run)| Reverse((run.id(0), r, 0)))
            .collect();
        let mut written = 0;
        while let Some(Reverse((id, r, i))) = heap.pop() {
            if out.gone {
                return;
            }
            let mut last = (r, i);
            advance(&mut heap, runs, r, i);
            while let Some(&Reverse((next, r, i))) = heap.peek()
                && next == id
            {
                heap.pop();
                last = (r, i);
                advance(&mut heap, runs, r, i);
            }
            let run = &runs[last.0];
            let kept = &run.kept[last.1];
            // A paused row without an owner and a hostname is listed under every hostname.
            let everywhere = kept.owner.is_none() && kept.hostname.is_none();
            if hostname.is_some()
                && !everywhere
                && kept.hostname.as_ref().map(|h| run.at(h)) != hostname
            {
                continue;
            }
            if written > 0 {
                out.bytes.push(b',');
                if written % BETWEEN_PAUSES == 0 {
                    out.pause().await;
                }
            }
            written += 1;
            let body = &mut out.bytes;
            body.push(b'{');
            if let Some(expiry) = kept.expiry {
                body.extend_from_slice(b"\"expiry\":");
                body.extend_from_slice(itoa::Buffer::new().format(expiry).as_bytes());
                body.push(b',');
            }
            body.extend_from_slice(b"\"id\":");
            body.extend(json_string(id));
            if let Some(paused) = &kept.paused {
                body.extend_from_slice(b",\"paused\":");
                body.extend_from_slice(run.at(paused).as_bytes());
            }
            body.extend_from_slice(b",\"sessionId\":");
            match kept.owner {
                Some(owner) => body.extend_from_slice(&owners.json[owner as usize]),
                None => body.extend_from_slice(b"null"),
            }
            if let Some(tag) = &kept.tag {
                body.extend_from_slice(b",\"tag\":");
                body.extend(json_string(run.at(tag)));
            }
            body.push(b'}');
        }
    }
}

/// The overview's answer as it is written: whole in `bytes`, or streamed (chunked) to the
/// request's connection.
pub struct Body<'r, 'a> {
    /// What is written and not sent yet.
    pub bytes: Vec<u8>,
    stream: Option<&'r mut Request<'a>>,
    close: bool,
    /// The client went away mid-answer: nothing more is written.
    gone: bool,
}

impl<'r, 'a> Body<'r, 'a> {
    /// Streamed to a GET of HTTP/1.1 (chunked) or HTTP/2, whole otherwise (HEAD must announce a
    /// length, and HTTP/1.0 has no chunks).
    pub fn for_request(req: &'r mut Request<'a>, size_hint: usize) -> Body<'r, 'a> {
        if req.version() == http::Version::HTTP_10 || req.method() == http::Method::HEAD {
            return Body {
                bytes: Vec::with_capacity(size_hint),
                stream: None,
                close: false,
                gone: false,
            };
        }
        let close = !req.keep_alive();
        let persistence = if close {
            Persistence::Close
        } else {
            Persistence::Implicit
        };
        // The node's own fields: always writable.
        let _ = req.start_answer(StatusCode::OK, BodyFraming::Chunked, persistence, |head| {
            head.field(&CONTENT_TYPE, b"application/json")?;
            head.field(&DATE, current_date().as_bytes())
        });
        Body {
            bytes: Vec::with_capacity(CHUNK + CHUNK / 4),
            stream: Some(req),
            close,
            gone: false,
        }
    }

    pub fn gone(&self) -> bool {
        self.gone
    }

    /// Lets the core's other tasks in: on a streamed body with a chunk's worth written, by
    /// sending it (the write is the pause, and the client's reading paces the listing);
    /// else by yielding.
    pub async fn pause(&mut self) {
        match self.stream.as_deref_mut() {
            Some(req) if self.bytes.len() >= CHUNK => {
                let chunk = Bytes::copy_from_slice(&self.bytes);
                req.answer_data(chunk);
                self.bytes.clear();
                self.gone = !req.flush().await;
            }
            _ => yield_now().await,
        }
    }

    /// The answer: the whole body, or (streamed) the last chunk and the end of the body sent,
    /// and the relayed stand-in the server expects.
    pub async fn finish(self) -> Response {
        let Some(req) = self.stream else {
            return Response::json(StatusCode::OK, self.bytes);
        };
        let mut gone = self.gone;
        if !gone {
            req.answer_data(self.bytes.into());
            req.end_answer();
            gone = !req.flush().await;
        }
        Response::relayed(StatusCode::OK, self.close || gone)
    }
}

/// Puts run `r`'s entry after `i` on the heap, if it has one.
fn advance<'r>(
    heap: &mut BinaryHeap<Reverse<(&'r str, usize, usize)>>,
    runs: &'r [Run],
    r: usize,
    i: usize,
) {
    let run = &runs[r];
    if i + 1 < run.kept.len() {
        heap.push(Reverse((run.id(i + 1), r, i + 1)));
    }
}

fn json_string(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).expect("a string serializes")
}

/// Lets the core's other tasks (its data-plane requests) run before going on. monoio runs a
/// task that wakes itself while it runs again at once, ahead of every other task (and of the
/// driver's completions, for a while): the wake has to come from behind them, from a task
/// spawned at the back of the queue.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            let waker = cx.waker().clone();
            monoio::spawn(async move { waker.wake() });
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// (id, owner, expiry, tag, hostname)
    type Entry<'a> = (&'a str, u32, Option<u64>, Option<&'a str>, Option<&'a str>);

    fn run(entries: &[Entry<'_>]) -> Run {
        let mut run = Run::default();
        for &(id, owner, expiry, tag, hostname) in entries {
            let id = run.push(id);
            let tag = tag.map(|t| run.push(t));
            let hostname = hostname.map(|h| run.push(h));
            run.kept.push(Kept {
                id,
                owner: Some(owner),
                expiry,
                tag,
                hostname,
                paused: None,
            });
        }
        run
    }

    fn on_a_core<T>(task: impl Future<Output = T>) -> T {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap();
        runtime.block_on(task)
    }

    fn buffered() -> Body<'static, 'static> {
        Body {
            bytes: Vec::new(),
            stream: None,
            close: false,
            gone: false,
        }
    }

    fn written(listing: &Listing, hostname: Option<&str>, owners: &Owners<'_>) -> String {
        let mut body = buffered();
        on_a_core(listing.write(hostname, owners, &mut body));
        String::from_utf8(body.bytes).unwrap()
    }

    #[test]
    fn runs_merge_in_id_order_and_a_repeated_id_is_listed_as_last_read() {
        let owners = Owners::new(["s1", "s2"].into_iter());
        let listing = Listing {
            runs: vec![
                run(&[
                    ("a", 0, None, None, None),
                    ("c", 0, Some(7), Some("t\"q"), Some("h1")),
                ]),
                run(&[("b", 1, None, None, Some("h2")), ("c", 1, None, None, None)]),
                run(&[("d", 0, None, None, Some("h1"))]),
            ],
            entries: 5,
            text: 0,
        };
        assert_eq!(
            written(&listing, None, &owners),
            r#"{"id":"a","sessionId":"s1"},{"id":"b","sessionId":"s2"},{"id":"c","sessionId":"s2"},{"id":"d","sessionId":"s1"}"#
        );
        assert_eq!(
            written(&listing, Some("h1"), &owners),
            r#"{"id":"d","sessionId":"s1"}"#
        );
        let first = Listing {
            runs: vec![run(&[("c", 0, Some(7), Some("t\"q"), None)])],
            entries: 1,
            text: 0,
        };
        assert_eq!(
            written(&first, None, &owners),
            r#"{"expiry":7,"id":"c","sessionId":"s1","tag":"t\"q"}"#
        );
        assert_eq!(written(&Listing::default(), None, &owners), "");
    }

    #[test]
    fn a_paused_row_shows_its_pause_and_a_placeholder_no_owner_under_every_hostname() {
        let owners = Owners::new(["s1"].into_iter());
        let mut run = run(&[("a", 0, None, None, Some("h1"))]);
        let pause = r#"{"at":7,"by":"ops","reason":null}"#;
        let paused = Some(run.push(pause));
        run.kept[0].paused = paused.clone();
        let id = run.push("b");
        run.kept.push(Kept {
            id,
            owner: None,
            expiry: None,
            tag: None,
            hostname: None,
            paused,
        });
        let listing = Listing {
            runs: vec![run],
            entries: 2,
            text: 0,
        };
        let both = format!(
            r#"{{"id":"a","paused":{pause},"sessionId":"s1"}},{{"id":"b","paused":{pause},"sessionId":null}}"#
        );
        assert_eq!(written(&listing, Some("h1"), &owners), both);
        assert_eq!(
            written(&listing, Some("h2"), &owners),
            format!(r#"{{"id":"b","paused":{pause},"sessionId":null}}"#)
        );
    }

    #[test]
    fn a_listing_keeps_live_unfenced_rows_and_every_paused_one() {
        let owners = Owners::new(["live"].into_iter());
        let keep = Keep {
            now: 100,
            prefix: Some("a"),
            tag: None,
        };
        let row = |owner: &str, expiry: Option<u64>, paused: bool| PlacementRow {
            session_id: Some(owner.into()),
            expiry,
            paused: paused.then(|| crate::store::Paused {
                by: "ops".into(),
                at: 1,
                reason: None,
            }),
            ..PlacementRow::default()
        };
        assert_eq!(
            keep.owner("a1", &row("live", None, false), &owners),
            Some(Some(0))
        );
        assert_eq!(
            keep.owner("a1", &row("live", Some(100), false), &owners),
            None
        );
        assert_eq!(keep.owner("a1", &row("gone", None, false), &owners), None);
        assert_eq!(keep.owner("a1", &row("", None, false), &owners), None);
        assert_eq!(
            keep.owner("a1", &row("live", Some(100), true), &owners),
            Some(Some(0))
        );
        assert_eq!(
            keep.owner("a1", &row("gone", None, true), &owners),
            Some(None)
        );
        assert_eq!(keep.owner("a1", &row("", None, true), &owners), Some(None));
        assert_eq!(
            keep.owner("b1", &row("", None, true), &owners),
            None,
            "prefix"
        );
    }

    /// 2500 entries in two runs, every other id in each.
    fn big() -> (Listing, Vec<String>) {
        let ids: Vec<String> = (0..2500).map(|i| format!("id-{i:05}")).collect();
        let (even, odd): (Vec<_>, Vec<_>) = ids
            .iter()
            .partition(|id| id.ends_with(['0', '2', '4', '6', '8']));
        let entries = |ids: &[&String]| {
            let all: Vec<_> = ids
                .iter()
                .map(|id| (id.as_str(), 0, None, None, None))
                .collect();
            run(&all)
        };
        let big = Listing {
            runs: vec![entries(&odd), entries(&even)],
            entries: 2500,
            text: 0,
        };
        (big, ids)
    }

    #[test]
    fn a_listing_of_several_pages_is_written_whole() {
        let owners = Owners::new(["s1"].into_iter());
        let (big, ids) = big();
        let body = format!("[{}]", written(&big, None, &owners));
        let listed: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        let listed: Vec<&str> = listed.iter().map(|e| e["id"].as_str().unwrap()).collect();
        assert_eq!(listed, ids);
    }

    /// monoio runs a task that wakes itself again at once: the writer's yield must let the
    /// core's other tasks in.
    #[test]
    fn the_cores_other_tasks_run_while_a_long_listing_is_written() {
        let owners = Owners::new(["s1"].into_iter());
        let (big, _) = big();
        let (done, seen_during) = (Rc::new(Cell::new(false)), Rc::new(Cell::new(false)));
        on_a_core(async {
            let (d, s) = (done.clone(), seen_during.clone());
            monoio::spawn(async move { s.set(!d.get()) });
            big.write(None, &owners, &mut buffered()).await;
            done.set(true);
        });
        assert!(
            seen_during.get(),
            "a spawned task waited for the whole listing"
        );
    }
}
