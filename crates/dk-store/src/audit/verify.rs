//! Verifying the audit log: [`QuickCheck`], the first pass, which keeps
//! nothing of an entry past the next, and [`Verifier`], the second, which
//! keeps enough of each entry to say what is wrong and where, keyed chain
//! included.

use std::collections::HashMap;

use serde_json::Value;

use super::chain::{GENESIS_HASH, Hashing, KEYED_KIND, RawRow};
use crate::key::AuditKey;
use crate::{AuditProblem, ProblemKind, VerifyReport};

/// How far from its stored `seq` an entry's content is looked for when its
/// hash does not match: this tells a renumbered entry from an edited one.
const MAX_SHIFT: i64 = 8;

/// How many mismatching entries are compared pairwise to find swapped
/// content; past this, they are reported as edited.
const MAX_SWAP_CANDIDATES: usize = 256;

/// What the verifier keeps of each entry.
pub(super) struct Meta {
    seq: i64,
    /// The `seq` under which the entry's content gives its stored hash: its
    /// own when untouched, a nearby one when renumbered, none when edited.
    content_seq: Option<i64>,
    prev_hash: String,
    hash: String,
}

/// Verifies a log fed to it entry by entry in stored order. Keeps the hashes
/// of every entry (about 160 bytes each), and the content only of entries
/// whose hash does not match. Entries from an `audit-keyed` entry on are
/// checked under the key given, when it is that entry's; without it only
/// their links are checked, and the report says so.
pub(crate) struct Verifier<'k> {
    key: Option<&'k AuditKey>,
    /// The given key's id.
    key_id: Option<String>,
    /// Where the chain turned keyed and with which key id, once met.
    keyed: Option<(i64, String)>,
    /// What the store's table says about it, when it has one.
    recorded: Option<Option<(i64, String)>>,
    metas: Vec<Meta>,
    /// Entries whose hash matches their content under no nearby seq, with
    /// their position (content kept for the first [`MAX_SWAP_CANDIDATES`]).
    mismatched: Vec<(usize, i64, Option<RawRow>)>,
}

impl<'k> Verifier<'k> {
    /// A verifier checking keyed entries under `key`, when given.
    pub fn new(key: Option<&'k AuditKey>) -> Verifier<'k> {
        Verifier {
            key,
            key_id: key.map(AuditKey::id),
            keyed: None,
            recorded: None,
            metas: Vec::new(),
            mismatched: Vec::new(),
        }
    }

    /// What the store records of the chain's key (the entry that keyed it
    /// and the key's id), to be checked against the chain. Only the SQLite
    /// store records it.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn recorded_key(&mut self, recorded: Option<(i64, String)>) {
        self.recorded = Some(recorded);
    }

    /// How the entry stored at `seq` is hashed; `None` when it is keyed and
    /// the key at hand is not the chain's.
    pub(super) fn hashing(&self, seq: i64) -> Option<Hashing<'k>> {
        hashing_at(&self.keyed, self.key, self.key_id.as_deref(), seq)
    }

    /// Takes the next entry in stored order.
    pub fn push(&mut self, row: RawRow) {
        note_keyed(&mut self.keyed, &row);
        let position = self.metas.len();
        let content_seq = match self.hashing(row.seq) {
            // Without the key nothing can be said of the content.
            None => Some(row.seq),
            Some(hashing) => {
                let matches = |seq: i64| {
                    hashing.of(&row.prev_hash, seq, row.at_ms, &row.kind, &row.entry) == row.hash
                };
                if matches(row.seq) {
                    Some(row.seq)
                } else {
                    (1..=MAX_SHIFT)
                        .flat_map(|d| [row.seq.saturating_sub(d), row.seq.saturating_add(d)])
                        .find(|&seq| seq >= 1 && matches(seq))
                }
            }
        };
        if content_seq.is_none() {
            let keep = self.mismatched.len() < MAX_SWAP_CANDIDATES;
            let seq = row.seq;
            self.mismatched
                .push((position, seq, keep.then(|| row.clone())));
        }
        self.metas.push(Meta {
            seq: row.seq,
            content_seq,
            prev_hash: row.prev_hash,
            hash: row.hash,
        });
    }

    /// The problems with the chain's key (see [`key_problems`]).
    pub(super) fn key_problems(&self) -> Vec<AuditProblem> {
        key_problems(&self.keyed, self.key_id.as_deref(), self.recorded.as_ref())
    }

    /// The report over everything pushed: the entries whose content was
    /// changed, then the links of the chain, then its key.
    pub fn finish(&self) -> VerifyReport {
        let mut problems = Problems::default();
        let reported = self.report_mismatched(&mut problems);
        self.report_links(&mut problems, &reported);
        let mut problems = problems.0;
        problems.extend(self.key_problems());
        problems.sort_by_key(|problem| problem.seq);
        let (entries, head) = self
            .metas
            .last()
            .map_or((0, GENESIS_HASH.to_owned()), |meta| {
                (u64::try_from(meta.seq).unwrap_or(0), meta.hash.clone())
            });
        VerifyReport {
            entries,
            head,
            problems,
        }
    }

    /// Reports each entry whose hash does not match its content: content
    /// swapped between entries (an entry's content hashes to another
    /// mismatching entry's hash under that entry's seq and prev_hash), or
    /// else edited. Returns, by position, the entries reported.
    fn report_mismatched(&self, problems: &mut Problems) -> Vec<bool> {
        let metas = &self.metas;
        let mut reported = vec![false; metas.len()];
        for (position, seq, row) in &self.mismatched {
            let found = row.as_ref().and_then(|row| {
                self.mismatched.iter().find_map(|(other, _, _)| {
                    let meta = metas.get(*other)?;
                    let hashing = self.hashing(meta.seq)?;
                    (other != position
                        && hashing.of(&meta.prev_hash, meta.seq, row.at_ms, &row.kind, &row.entry)
                            == meta.hash)
                        .then_some(meta.seq)
                })
            });
            match found {
                Some(other) => problems.add(
                    *seq,
                    ProblemKind::OutOfOrder,
                    format!("it holds the content of entry {other}"),
                ),
                None => problems.add(
                    *seq,
                    ProblemKind::Edited,
                    "its hash does not match its content".to_owned(),
                ),
            }
            if let Some(flag) = reported.get_mut(*position) {
                *flag = true;
            }
        }
        reported
    }

    /// Reports the chain's broken links: each entry's prev_hash against the
    /// hash of the entry stored before it, `reported` the entries already
    /// reported for their content.
    fn report_links(&self, problems: &mut Problems, reported: &[bool]) {
        let mut walk = Walk::new(&self.metas);
        for (i, meta) in self.metas.iter().enumerate() {
            if let Some(before) = walk.prev_seq.filter(|&before| meta.seq <= before) {
                problems.add(
                    meta.seq,
                    ProblemKind::Inserted,
                    format!("it is stored after entry {before}"),
                );
                walk.unlink(i);
                continue;
            }
            let seq = meta.content_seq.unwrap_or(meta.seq);
            if meta.prev_hash != walk.prev_hash {
                walk.unlink(i);
                if let Some((at, what, detail)) = walk.why_unlinked(i, meta, seq, reported) {
                    problems.add(at, what, detail);
                }
            }
            walk.prev_hash = meta.hash.as_str();
            walk.prev_seq = Some(meta.seq);
            walk.max_seq = walk.max_seq.max(seq);
        }
    }
}

/// The problems a verification found, as it finds them.
#[derive(Default)]
struct Problems(Vec<AuditProblem>);

impl Problems {
    fn add(&mut self, seq: i64, what: ProblemKind, detail: String) {
        self.0.push(AuditProblem {
            seq: u64::try_from(seq).unwrap_or(0),
            what,
            detail,
        });
    }
}

/// The walk along the stored entries that checks the chain's links: what
/// the check of an entry needs of those stored before it.
struct Walk<'m> {
    metas: &'m [Meta],
    /// Each hash's first position.
    by_hash: HashMap<&'m str, usize>,
    /// By position, the entries not linked to the one stored before them.
    unlinked: Vec<bool>,
    prev_hash: &'m str,
    prev_seq: Option<i64>,
    max_seq: i64,
}

impl<'m> Walk<'m> {
    fn new(metas: &'m [Meta]) -> Walk<'m> {
        let mut by_hash: HashMap<&str, usize> = HashMap::with_capacity(metas.len());
        for (position, meta) in metas.iter().enumerate() {
            by_hash.entry(meta.hash.as_str()).or_insert(position);
        }
        Walk {
            metas,
            by_hash,
            unlinked: vec![false; metas.len()],
            prev_hash: GENESIS_HASH,
            prev_seq: None,
            max_seq: 0,
        }
    }

    /// The seq of the entry stored at `position`.
    fn seq_at(&self, position: usize) -> i64 {
        self.metas.get(position).map_or(0, |meta| meta.seq)
    }

    /// Marks the entry at `position` as not linked to the one before it.
    fn unlink(&mut self, position: usize) {
        if let Some(flag) = self.unlinked.get_mut(position) {
            *flag = true;
        }
    }

    /// Why the entry `meta` at position `i` (its content's seq `seq`) is
    /// not chained to the one stored before it, as the problem to report
    /// (seq, kind, detail): `None` when a problem already reported
    /// explains it.
    fn why_unlinked(
        &self,
        i: usize,
        meta: &Meta,
        seq: i64,
        reported: &[bool],
    ) -> Option<(i64, ProblemKind, String)> {
        // The position of the entry this one was chained to; -1 is the
        // start of the chain.
        let pred: Option<isize> = if meta.prev_hash == GENESIS_HASH {
            Some(-1)
        } else {
            self.by_hash
                .get(meta.prev_hash.as_str())
                .and_then(|&p| isize::try_from(p).ok())
        };
        let here = isize::try_from(i).unwrap_or(isize::MAX);
        let before = |flags: &[bool]| {
            i.checked_sub(1)
                .and_then(|b| flags.get(b))
                .copied()
                .unwrap_or(false)
        };
        if before(&self.unlinked) {
            // Explained by the problem reported at the entry before.
            None
        } else if let Some(p) = pred.filter(|&p| p > here) {
            let after = usize::try_from(p).map_or(0, |p| self.seq_at(p));
            Some((
                meta.seq,
                ProblemKind::OutOfOrder,
                format!("it follows entry {after}, which is stored after it"),
            ))
        } else if seq > self.max_seq.saturating_add(1) {
            let first = self.max_seq.saturating_add(1);
            let last = seq - 1;
            Some((
                first,
                ProblemKind::Missing,
                if first == last {
                    format!("entry {} is chained to it", meta.seq)
                } else {
                    format!("entries {first} to {last} are gone")
                },
            ))
        } else if let Some(p) = pred.filter(|&p| p < here - 1) {
            let first = usize::try_from(p + 1).map_or(0, |p| self.seq_at(p));
            let last = self.prev_seq.unwrap_or(first);
            let from = if p < 0 {
                "the start of the chain".to_owned()
            } else {
                format!("entry {}", usize::try_from(p).map_or(0, |p| self.seq_at(p)))
            };
            Some((
                first,
                ProblemKind::Inserted,
                if first == last {
                    format!("entry {} is chained to {from}", meta.seq)
                } else {
                    format!(
                        "entries {first} to {last} are not in the chain: entry {} is chained to {from}",
                        meta.seq
                    )
                },
            ))
        } else if i == 0 {
            Some((
                meta.seq,
                ProblemKind::Edited,
                "it does not start the chain".to_owned(),
            ))
        } else if !before(reported) {
            Some((
                self.prev_seq.unwrap_or(0),
                ProblemKind::Edited,
                format!(
                    "its hash was rewritten: entry {} is chained to a different one",
                    meta.seq
                ),
            ))
        } else {
            None
        }
    }
}

/// Notes where the chain turned keyed, and with which key id, when `row`
/// is the first `audit-keyed` entry.
pub(super) fn note_keyed(keyed: &mut Option<(i64, String)>, row: &RawRow) {
    if row.kind == KEYED_KIND && keyed.is_none() {
        let id = serde_json::from_str::<Value>(&row.entry)
            .ok()
            .and_then(|entry| entry.get("keyId")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        *keyed = Some((row.seq, id));
    }
}

/// How the entry stored at `seq` is hashed, in a chain keyed as `keyed`
/// says, checked with `key` (whose id is `key_id`): `None` when it is keyed
/// and that key is not the chain's (its content cannot be checked).
pub(super) fn hashing_at<'k>(
    keyed: &Option<(i64, String)>,
    key: Option<&'k AuditKey>,
    key_id: Option<&str>,
    seq: i64,
) -> Option<Hashing<'k>> {
    match keyed {
        Some((from, id)) if seq >= *from => match (key, key_id) {
            (Some(key), Some(given)) if given == id => Some(Hashing::Keyed(key)),
            _ => None,
        },
        _ => Some(Hashing::Plain),
    }
}

/// The problems with the chain's key: keyed but not checkable with the key
/// at hand (`key_id`), a key given for a chain nobody keyed, or the store's
/// record of the key (`recorded`, when it keeps one) that does not match
/// the chain.
pub(super) fn key_problems(
    keyed: &Option<(i64, String)>,
    key_id: Option<&str>,
    recorded: Option<&Option<(i64, String)>>,
) -> Vec<AuditProblem> {
    let mut problems = Vec::new();
    let mut problem = |seq: i64, detail: String| {
        problems.push(AuditProblem {
            seq: u64::try_from(seq).unwrap_or(0),
            what: ProblemKind::Key,
            detail,
        });
    };
    match (keyed, key_id) {
        (Some((from, id)), None) => problem(
            *from,
            format!(
                "the chain is keyed from here with key {id}: its entries can be checked only with that key"
            ),
        ),
        (Some((from, id)), Some(given)) if id != given => problem(
            *from,
            format!("the chain is keyed with key {id}, not with the key given ({given})"),
        ),
        (None, Some(given)) => problem(
            0,
            format!(
                "a key was given ({given}) but no entry keys the chain: it was never keyed, or it was rewritten without the key"
            ),
        ),
        _ => {}
    }
    if let Some(recorded) = recorded
        && recorded != keyed
    {
        let said = |keyed: &Option<(i64, String)>| match keyed {
            Some((seq, id)) => format!("keyed from entry {seq} with key {id}"),
            None => "not keyed".to_owned(),
        };
        problem(
            recorded
                .as_ref()
                .or(keyed.as_ref())
                .map_or(0, |(seq, _)| *seq),
            format!(
                "the store records the chain as {}, the chain is {}",
                said(recorded),
                said(keyed)
            ),
        );
    }
    problems
}

/// The first of a verification's two passes over a log read in stored
/// order: it keeps nothing of an entry once the next is read (the last
/// position and hash, where the chain turned keyed), so a log of any size
/// is checked in the same memory. Every entry must follow the one before
/// it (its `seq` the next, its `prev_hash` that one's hash) and hash to its
/// own hash. When all do, the log is whole and its report is
/// [`QuickCheck::finish`]'s; at the first that does not, it stops looking,
/// and a second pass through a [`Verifier`], which keeps about 160 bytes
/// of every entry, says what is wrong and where.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) struct QuickCheck<'k> {
    key: Option<&'k AuditKey>,
    key_id: Option<String>,
    keyed: Option<(i64, String)>,
    /// The last entry's position and hash.
    last: Option<(i64, String)>,
    whole: bool,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<'k> QuickCheck<'k> {
    /// A check of keyed entries under `key`, when given.
    pub fn new(key: Option<&'k AuditKey>) -> QuickCheck<'k> {
        QuickCheck {
            key,
            key_id: key.map(AuditKey::id),
            keyed: None,
            last: None,
            whole: true,
        }
    }

    /// Takes the next entry in stored order.
    pub fn push(&mut self, row: &RawRow) {
        if !self.whole {
            return;
        }
        note_keyed(&mut self.keyed, row);
        let (seq, prev_hash) = match &self.last {
            Some((seq, hash)) => (seq.checked_add(1), hash.as_str()),
            None => (Some(1), GENESIS_HASH),
        };
        let linked = seq == Some(row.seq) && row.prev_hash == prev_hash;
        let hashed = match hashing_at(&self.keyed, self.key, self.key_id.as_deref(), row.seq) {
            // Without the chain's key nothing can be said of the content.
            None => true,
            Some(hashing) => {
                hashing.of(&row.prev_hash, row.seq, row.at_ms, &row.kind, &row.entry) == row.hash
            }
        };
        if !(linked && hashed) {
            self.whole = false;
            return;
        }
        match &mut self.last {
            Some((seq, hash)) => {
                *seq = row.seq;
                hash.clone_from(&row.hash);
            }
            None => self.last = Some((row.seq, row.hash.clone())),
        }
    }

    /// The report, when every entry followed the one before it (only the
    /// chain's key may then be a problem, as [`Verifier::finish`] would
    /// say): with `recorded`, what the store records of the chain's key.
    /// `None` when one did not: a second pass must say what is wrong.
    pub fn finish(self, recorded: Option<Option<(i64, String)>>) -> Option<VerifyReport> {
        if !self.whole {
            return None;
        }
        let mut problems = key_problems(&self.keyed, self.key_id.as_deref(), recorded.as_ref());
        problems.sort_by_key(|problem| problem.seq);
        let (entries, head) = self
            .last
            .map_or((0, GENESIS_HASH.to_owned()), |(seq, hash)| {
                (u64::try_from(seq).unwrap_or(0), hash)
            });
        Some(VerifyReport {
            entries,
            head,
            problems,
        })
    }
}
