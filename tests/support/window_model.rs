//! A naive batch computation of the window semantics (the design's, which
//! are Flink's), shared by the window oracle tests: record `i` is judged
//! under the watermark of the records before it. With restore points, the
//! model is what a job restored at those positions must commit: its state
//! (open windows, and which of them fired) carries over, the watermark
//! starts again (as in Flink), and a window that had fired fires again only
//! when records are added to it after the restore.

use std::collections::BTreeMap;

use weibo::window::Window;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Ev {
    pub key: u8,
    pub ts: i64,
    pub value: i64,
    pub seq: u32,
}

#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Tumbling { size: i64, offset: i64 },
    Sliding { size: i64, slide: i64, offset: i64 },
    Session { gap: i64 },
}

/// A firing: key, window, and the sorted sequence numbers of its records.
pub type Firing = (u8, i64, i64, Vec<u32>);

#[derive(Debug, Default, PartialEq)]
pub struct Naive {
    pub firings: Vec<Firing>,
    pub late: Vec<u32>,
}

pub fn aligned(ts: i64, size: i64, slide: i64, offset: i64) -> Vec<Window> {
    let mut out = Vec::new();
    let mut start = ts - (ts - offset).rem_euclid(slide);
    while start + size > ts {
        out.push(Window { start, end: start + size });
        start -= slide;
    }
    out
}

/// One window's records and whether its current contents have fired.
#[derive(Debug, Clone)]
struct Open {
    seqs: Vec<u32>,
    fired: bool,
}

/// The model of a run without restores.
pub fn naive(input: &[Ev], bound: i64, lateness: i64, kind: Kind) -> Naive {
    naive_with_restores(input, bound, lateness, kind, &[])
}

/// The model of a job restored at record positions `restores` (each the
/// position of a checkpoint: the records before it were read before its
/// barrier), in order.
pub fn naive_with_restores(input: &[Ev], bound: i64, lateness: i64, kind: Kind, restores: &[usize]) -> Naive {
    let mut out = Naive::default();
    // (key, window) -> contents; for sessions the windows of a key are disjoint.
    let mut open: BTreeMap<(u8, Window), Open> = BTreeMap::new();
    let mut max_ts = i64::MIN;
    let mut wm = i64::MIN;
    let fire = |open: &mut BTreeMap<(u8, Window), Open>, wm: i64, out: &mut Naive| {
        for ((k, w), o) in open.iter_mut() {
            if !o.fired && w.end - 1 <= wm {
                o.fired = true;
                let mut s = o.seqs.clone();
                s.sort_unstable();
                out.firings.push((*k, w.start, w.end, s));
            }
        }
        open.retain(|(_, w), _| w.end - 1 + lateness > wm);
    };
    for (i, e) in input.iter().enumerate() {
        // What the watermark of the records before fires.
        fire(&mut open, wm, &mut out);
        if restores.contains(&i) {
            // The checkpoint's barrier came here: the restored job's
            // watermark starts again.
            max_ts = i64::MIN;
            wm = i64::MIN;
        }
        let mut added = false;
        match kind {
            Kind::Tumbling { size, offset } | Kind::Sliding { size, offset, .. } => {
                let slide = match kind {
                    Kind::Sliding { slide, .. } => slide,
                    _ => size,
                };
                for w in aligned(e.ts, size, slide, offset) {
                    if w.end - 1 + lateness <= wm {
                        continue;
                    }
                    added = true;
                    let o = open.entry((e.key, w)).or_insert(Open { seqs: Vec::new(), fired: false });
                    o.seqs.push(e.seq);
                    // Fires at once if the watermark passed its end, or
                    // owes a firing until it does.
                    o.fired = w.end - 1 <= wm;
                    if o.fired {
                        let mut s = o.seqs.clone();
                        s.sort_unstable();
                        out.firings.push((e.key, w.start, w.end, s));
                    }
                }
            }
            Kind::Session { gap } => {
                let mut merged = Window { start: e.ts, end: e.ts + gap };
                let mut parts = Vec::new();
                for (k, w) in open.keys() {
                    if *k == e.key && w.start <= merged.end && w.end >= merged.start {
                        merged = Window { start: merged.start.min(w.start), end: merged.end.max(w.end) };
                        parts.push(*w);
                    }
                }
                if merged.end - 1 + lateness > wm {
                    added = true;
                    let mut seqs = vec![e.seq];
                    for p in parts {
                        seqs.extend(open.remove(&(e.key, p)).unwrap().seqs);
                    }
                    let mut o = Open { seqs, fired: false };
                    if merged.end - 1 <= wm {
                        o.fired = true;
                        let mut s = o.seqs.clone();
                        s.sort_unstable();
                        out.firings.push((e.key, merged.start, merged.end, s));
                    }
                    open.insert((e.key, merged), o);
                }
            }
        }
        if !added && e.ts + lateness <= wm {
            out.late.push(e.seq);
        }
        if e.ts > max_ts {
            max_ts = e.ts;
            wm = wm.max(max_ts - bound - 1);
        }
    }
    fire(&mut open, i64::MAX, &mut out);
    out.firings.sort();
    out.late.sort_unstable();
    out
}

/// Whether no record of `input` is behind the watermark when it comes (a
/// record's event time is above `max_ts_seen - bound - 1`): then a
/// restore, which only lowers the watermark for a while, changes nothing.
pub fn in_order(input: &[Ev], bound: i64) -> bool {
    let mut max_ts = i64::MIN;
    input.iter().all(|e| {
        let ok = max_ts == i64::MIN || e.ts > max_ts - bound - 1;
        max_ts = max_ts.max(e.ts);
        ok
    })
}
