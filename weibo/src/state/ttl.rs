//! State time-to-live: values that expire a set time after they were
//! written (or read), are never returned once expired, and are cleaned
//! up without scanning the whole state on the record path.
//!
//! Each value is stored with the time it expires at ([`Expiring`]). An
//! access that finds it expired treats it as absent and removes it; a
//! sweep removes the expired entries of one key group at a time (the
//! operator sweeps its key groups in turn, a little at a time); a restore
//! drops the entries that have expired by then; a backend that can drop
//! them by itself (fjall, as it compacts) is given the state's clock
//! ([`ExpiryClock`]). Every removal of an expired entry is counted.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::codec::key::Key;
use crate::codec::{CodecError, CodecId, Data};
use crate::error::Result;
use crate::record::{NO_TIMESTAMP, Timestamp};
use crate::state::map_state::ByteRange;
use crate::state::{
    Barrier, EntryRef, KeyedState, ListStore, MapStore, RemovedRef, Snapshot, StateBackend, StateScope, StateStats,
    ValueStore,
};

/// How long a state's values live: Flink's `StateTtlConfig`, as far as
/// Weibo goes.
///
/// A value expires `ttl` after it was last written ([`StateTtl::after_write`])
/// or last read or written ([`StateTtl::after_read`]); an expired value is
/// never returned. Time is processing time (the wall clock, or a test
/// harness's) unless [`StateTtl::in_event_time`] makes it the operator's
/// watermark. Expired values are removed when an access finds them, when
/// the operator sweeps their key group (it sweeps one key group of each
/// state with a time-to-live every 100 ms), and when a restore meets them.
///
/// On fjall a compaction filter also drops expired entries as fjall
/// compacts its tables, without reading them on the record path.
///
/// In event time the clock never goes back: it is the highest watermark
/// the state has seen, and a checkpoint records it, so that a restore
/// drops the entries that had expired when the checkpoint was taken and
/// the restored state's clock starts there (a restored job's watermark
/// starts again from the records read again).
///
/// Differences from Flink: the visibility is always never-return-expired;
/// time can be event time (Flink's is processing time only); a list or
/// map expires entry by entry, a value, reducing or aggregating state
/// whole.
///
/// ```
/// use std::time::Duration;
/// use weibo::process::StateTtl;
/// let ttl = StateTtl::after_write(Duration::from_secs(3_600));
/// let read = StateTtl::after_read(Duration::from_secs(60)).in_event_time();
/// # let _ = (ttl, read);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateTtl {
    millis: i64,
    on_read: bool,
    event_time: bool,
}

impl StateTtl {
    /// Values expire `ttl` after they were last written.
    pub fn after_write(ttl: Duration) -> Self {
        Self { millis: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX), on_read: false, event_time: false }
    }

    /// Values expire `ttl` after they were last read or written.
    pub fn after_read(ttl: Duration) -> Self {
        Self { on_read: true, ..Self::after_write(ttl) }
    }

    /// Measures time by the operator's watermark instead of the wall clock.
    #[must_use]
    pub fn in_event_time(self) -> Self {
        Self { event_time: true, ..self }
    }

    fn expiry(&self, now: Timestamp) -> Timestamp {
        now.saturating_add(self.millis)
    }
}

/// A value and the time it expires at (milliseconds, in its state's
/// time-to-live clock). Encoded as the time (8 bytes, big-endian) followed
/// by the value's own encoding.
#[derive(Clone, Debug, PartialEq)]
pub struct Expiring<T> {
    expires: Timestamp,
    value: T,
}

impl<T> Expiring<T> {
    fn live(&self, now: Timestamp) -> bool {
        self.expires > now
    }
}

/// The time an encoded [`Expiring`] expires at, if the bytes hold one.
fn expires_at(bytes: &[u8]) -> Option<Timestamp> {
    let head: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some(i64::from_be_bytes(head))
}

impl<T: Data> Data for Expiring<T> {
    fn codec_id() -> CodecId {
        CodecId::new("weibo-ttl/1", std::any::type_name::<Self>())
    }

    fn encode(&self, out: &mut Vec<u8>) -> std::result::Result<(), CodecError> {
        out.extend_from_slice(&self.expires.to_be_bytes());
        self.value.encode(out)
    }

    fn decode(bytes: &[u8]) -> std::result::Result<Self, CodecError> {
        let expires = expires_at(bytes).ok_or_else(|| CodecError {
            codec: Self::codec_id(),
            reason: format!("{} bytes, too short for an expiry time", bytes.len()),
        })?;
        Ok(Self { expires, value: T::decode(bytes.get(8..).unwrap_or_default())? })
    }

    fn schema() -> std::sync::Arc<crate::codec::schema::Schema> {
        use crate::codec::schema::{Schema, Shape};
        std::sync::Arc::new(Schema {
            shape: Shape::Struct {
                name: "Expiring".into(),
                fields: vec![("expires".into(), Shape::I64), ("value".into(), T::schema().shape.clone())],
            },
        })
    }

    fn check_round_trip() -> std::result::Result<(), String> {
        T::check_round_trip()
    }
}

/// Drops the entries of a restored part that have expired at `now`,
/// counting them.
fn live_entries<'a>(entries: &mut [EntryRef<'a>], now: Option<Timestamp>, expired: &mut u64) -> Vec<EntryRef<'a>> {
    let mut live = Vec::with_capacity(entries.len());
    for entry in entries.iter() {
        match (now, expires_at(entry.2)) {
            (Some(now), Some(at)) if at <= now => *expired += 1,
            _ => live.push(*entry),
        }
    }
    live
}

/// The processing time now (the wall clock's, or a test's), as the
/// operator keeps it.
pub type Now = std::sync::Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// A state's time-to-live clock, shared with a backend that drops expired
/// entries by itself (fjall's compaction filter): the time at or before
/// which entries have expired, and how many the backend dropped.
#[derive(Debug)]
pub struct ExpiryClock {
    now: AtomicI64,
    dropped: AtomicU64,
}

impl ExpiryClock {
    fn new() -> Self {
        Self { now: AtomicI64::new(NO_TIMESTAMP), dropped: AtomicU64::new(0) }
    }

    /// Whether an entry whose encoding is `value` (an [`Expiring`]) has
    /// expired; counts it if so, the caller then dropping it.
    pub fn drops(&self, value: &[u8]) -> bool {
        let expired = expires_at(value).is_some_and(|at| at <= self.now.load(Ordering::Relaxed));
        if expired {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        expired
    }

    fn advance(&self, now: Timestamp) {
        self.now.fetch_max(now, Ordering::Relaxed);
    }
}

/// What every state with a time-to-live keeps besides its store.
struct Expiry {
    ttl: StateTtl,
    /// Expired entries removed so far (by the store; the backend counts
    /// its own in `shared`).
    expired: u64,
    /// Processing time, for restores.
    clock: Now,
    /// In event time, the highest watermark seen or restored: the clock.
    floor: Timestamp,
    /// In event time, the clock recorded with the checkpoint part being
    /// restored (`None`: a checkpoint that recorded none).
    restored: Option<Timestamp>,
    /// The clock as the backend sees it.
    shared: Arc<ExpiryClock>,
}

impl Expiry {
    /// Opens the state `scope` names on `backend` with `open`, after
    /// telling the backend its entries expire.
    fn open<S>(
        backend: &dyn StateBackend,
        scope: &StateScope,
        ttl: StateTtl,
        clock: Now,
        open: impl FnOnce(&dyn StateBackend, &StateScope) -> Result<S>,
    ) -> Result<(S, Self)> {
        let shared = Arc::new(ExpiryClock::new());
        backend.expire_entries(scope, shared.clone());
        let store = open(backend, scope)?;
        Ok((store, Self { ttl, expired: 0, clock, floor: NO_TIMESTAMP, restored: None, shared }))
    }

    /// The clock at processing time `now` and watermark `watermark`: `now`,
    /// or in event time the highest watermark seen (or restored).
    fn now(&mut self, now: Timestamp, watermark: Timestamp) -> Timestamp {
        if self.ttl.event_time {
            self.floor = self.floor.max(watermark);
            self.floor
        } else {
            now
        }
    }

    /// [`Expiry::now`], shared with the backend (which drops what has
    /// expired by it); returns the clock.
    fn observe(&mut self, now: Timestamp, watermark: Timestamp) -> Timestamp {
        let now = self.now(now, watermark);
        self.shared.advance(now);
        now
    }

    /// The time at or before which restored entries have expired, if
    /// known: processing time now, or the clock the checkpoint recorded.
    fn restore_now(&self) -> Option<Timestamp> {
        if self.ttl.event_time { self.restored } else { Some((self.clock)()) }
    }

    /// The clock a checkpoint records: in event time, the highest
    /// watermark seen (processing time needs none: a restore reads it).
    fn recorded(&self) -> Option<Timestamp> {
        (self.ttl.event_time && self.floor != NO_TIMESTAMP).then_some(self.floor)
    }

    /// The checkpoint part about to be restored recorded `clock`.
    fn restoring(&mut self, clock: Option<Timestamp>) {
        if self.ttl.event_time {
            self.restored = clock;
            if let Some(clock) = clock {
                self.floor = self.floor.max(clock);
                self.shared.advance(clock);
            }
        } else {
            self.shared.advance((self.clock)());
        }
    }

    fn stats(&self, mut stats: StateStats) -> StateStats {
        stats.expired += self.expired + self.shared.dropped.load(Ordering::Relaxed);
        stats
    }

    /// What a read at `now` finds in `slot`: the live value (its expiry
    /// moved on, if reads refresh), or nothing (an expired value is
    /// removed and counted).
    fn read<T: Clone>(&mut self, slot: &mut Option<Expiring<T>>, now: Timestamp) -> Option<T> {
        match slot.take() {
            Some(mut e) if e.live(now) => {
                if self.ttl.on_read {
                    e.expires = self.ttl.expiry(now);
                }
                let value = e.value.clone();
                *slot = Some(e);
                Some(value)
            }
            Some(_) => {
                self.expired += 1;
                None
            }
            None => None,
        }
    }

    /// Gives `f` the live value in `slot` at `now` (`None` if it has
    /// expired, which is counted) and stores what `f` leaves, expiring
    /// `ttl` from now.
    fn write<T>(&mut self, slot: &mut Option<Expiring<T>>, now: Timestamp, f: impl FnOnce(&mut Option<T>)) {
        let mut value = match slot.take() {
            Some(e) if e.live(now) => Some(e.value),
            Some(_) => {
                self.expired += 1;
                None
            }
            None => None,
        };
        f(&mut value);
        *slot = value.map(|value| Expiring { expires: self.ttl.expiry(now), value });
    }
}

/// Value state with a time-to-live.
pub struct TtlValueStore<K, T> {
    store: ValueStore<K, Expiring<T>>,
    expiry: Expiry,
}

impl<K: Key, T: Data> TtlValueStore<K, T> {
    /// Opens the value state `scope` names on `backend`, its values living
    /// as `ttl` says.
    ///
    /// # Errors
    /// As [`ValueStore::open`].
    pub(crate) fn open(backend: &dyn StateBackend, scope: &StateScope, ttl: StateTtl, clock: Now) -> Result<Self> {
        let (store, expiry) = Expiry::open(backend, scope, ttl, clock, ValueStore::open)?;
        Ok(Self { store, expiry })
    }

    /// The live value of `key` at time `now` (refreshed, if reads refresh).
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub(crate) fn get(&mut self, group: u16, key: &K, key_bytes: &[u8], now: Timestamp) -> Result<Option<T>> {
        if !self.expiry.ttl.on_read {
            // A read that finds the value live writes nothing.
            match self.store.get(group, key, key_bytes)? {
                Some(e) if e.live(now) => return Ok(Some(e.value)),
                None => return Ok(None),
                Some(_) => {}
            }
        }
        let expiry = &mut self.expiry;
        self.store.update(group, key.clone(), key_bytes, |slot| expiry.read(slot, now))
    }

    /// Changes the live value of `key` in place at time `now` (an expired
    /// one is `None` to `f`); what `f` leaves is written, expiring `ttl`
    /// from now.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub(crate) fn update(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        now: Timestamp,
        f: impl FnOnce(&mut Option<T>),
    ) -> Result<()> {
        let expiry = &mut self.expiry;
        self.store.update(group, key.clone(), key_bytes, |slot| expiry.write(slot, now, f))
    }

    /// Removes the values of key group `group` that have expired at `now`.
    ///
    /// # Errors
    /// As [`ValueStore::update`].
    pub(crate) fn sweep(&mut self, group: u16, now: Timestamp, watermark: Timestamp) -> Result<()> {
        let now = self.expiry.observe(now, watermark);
        let mut gone = Vec::new();
        self.store.for_each_in_group(group, |k, e| {
            if !e.live(now) {
                gone.push(k.clone());
            }
        })?;
        for key in gone {
            self.store.update(group, key, &[], |slot| *slot = None)?;
            self.expiry.expired += 1;
        }
        Ok(())
    }

    /// The time-to-live's clock at processing time `now` and `watermark`.
    pub(crate) fn now(&mut self, now: Timestamp, watermark: Timestamp) -> Timestamp {
        self.expiry.now(now, watermark)
    }

    /// Moves the clock the backend drops expired entries by to processing
    /// time `now` and watermark `watermark`.
    pub(crate) fn observe(&mut self, now: Timestamp, watermark: Timestamp) {
        self.expiry.observe(now, watermark);
    }
}

impl<K: Key, T: Data> KeyedState for TtlValueStore<K, T> {
    fn snapshot_at(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        KeyedState::snapshot_at(&mut self.store, operator, at)
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        let mut live = live_entries(entries, self.expiry.restore_now(), &mut self.expiry.expired);
        KeyedState::import_part(&mut self.store, operator, &mut live, removed)
    }

    fn expired_before(&self) -> Option<Timestamp> {
        self.expiry.recorded()
    }

    fn restoring(&mut self, clock: Option<Timestamp>) {
        self.expiry.restoring(clock);
    }

    fn stats(&self) -> StateStats {
        self.expiry.stats(KeyedState::stats(&self.store))
    }
}

/// Map state with a time-to-live per entry.
pub struct TtlMapStore<K, UK, UV> {
    store: MapStore<K, UK, Expiring<UV>>,
    expiry: Expiry,
}

impl<K: Key, UK: Key, UV: Data> TtlMapStore<K, UK, UV> {
    /// Opens the map state `scope` names on `backend`, its entries living
    /// as `ttl` says.
    ///
    /// # Errors
    /// As [`MapStore::open`].
    pub(crate) fn open(backend: &dyn StateBackend, scope: &StateScope, ttl: StateTtl, clock: Now) -> Result<Self> {
        let (store, expiry) = Expiry::open(backend, scope, ttl, clock, MapStore::open)?;
        Ok(Self { store, expiry })
    }

    /// The time-to-live's clock at processing time `now` and `watermark`.
    pub(crate) fn now(&mut self, now: Timestamp, watermark: Timestamp) -> Timestamp {
        self.expiry.now(now, watermark)
    }

    /// Moves the clock the backend drops expired entries by to processing
    /// time `now` and watermark `watermark`.
    pub(crate) fn observe(&mut self, now: Timestamp, watermark: Timestamp) {
        self.expiry.observe(now, watermark);
    }

    /// The live value at `user_key` at time `now` (refreshed, if reads
    /// refresh).
    ///
    /// # Errors
    /// As [`MapStore::get`].
    pub(crate) fn get(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        user_key: &UK,
        now: Timestamp,
    ) -> Result<Option<UV>> {
        if !self.expiry.ttl.on_read {
            match self.store.get(group, key, key_bytes, user_key)? {
                Some(e) if e.live(now) => return Ok(Some(e.value)),
                None => return Ok(None),
                Some(_) => {}
            }
        }
        let expiry = &mut self.expiry;
        self.store.update(group, key, key_bytes, user_key.clone(), |slot| expiry.read(slot, now))
    }

    /// Changes the live value at `user_key` in place at time `now`.
    ///
    /// # Errors
    /// As [`MapStore::update`].
    pub(crate) fn update(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        user_key: UK,
        now: Timestamp,
        f: impl FnOnce(&mut Option<UV>),
    ) -> Result<()> {
        let expiry = &mut self.expiry;
        self.store.update(group, key, key_bytes, user_key, |slot| expiry.write(slot, now, f))
    }

    /// Sets the value at `user_key`, expiring `ttl` from `now`.
    ///
    /// # Errors
    /// As [`MapStore::put`].
    pub(crate) fn put(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        user_key: UK,
        value: UV,
        now: Timestamp,
    ) -> Result<()> {
        let expires = self.expiry.ttl.expiry(now);
        self.store.put(group, key, key_bytes, user_key, Expiring { expires, value })
    }

    /// Removes the entry at `user_key`, returning its live value.
    ///
    /// # Errors
    /// As [`MapStore::remove`].
    pub(crate) fn remove(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        user_key: UK,
        now: Timestamp,
    ) -> Result<Option<UV>> {
        Ok(self.store.remove(group, key, key_bytes, user_key)?.filter(|e| e.live(now)).map(|e| e.value))
    }

    /// Calls `f` with the live entries in `range` at time `now`, in order,
    /// until it returns false; removes the expired ones it passes, and
    /// refreshes the ones it reads if reads refresh.
    ///
    /// # Errors
    /// As [`MapStore::for_each`].
    pub(crate) fn for_each(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        range: &ByteRange,
        now: Timestamp,
        mut f: impl FnMut(UK, UV) -> bool,
    ) -> Result<()> {
        let (mut gone, mut read) = (Vec::new(), Vec::new());
        let on_read = self.expiry.ttl.on_read;
        self.store.for_each(group, key, key_bytes, range, |uk, e| {
            if !e.live(now) {
                gone.push(uk);
                return true;
            }
            if on_read {
                read.push((uk.clone(), e.value.clone()));
            }
            f(uk, e.value)
        })?;
        for uk in gone {
            self.store.remove(group, key, key_bytes, uk)?;
            self.expiry.expired += 1;
        }
        for (uk, value) in read {
            self.put(group, key, key_bytes, uk, value, now)?;
        }
        Ok(())
    }

    /// Removes every entry of `key`'s map.
    ///
    /// # Errors
    /// As [`MapStore::clear`].
    pub(crate) fn clear(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<()> {
        self.store.clear(group, key, key_bytes)
    }

    /// Removes the entries of key group `group` that have expired.
    ///
    /// # Errors
    /// As [`MapStore::remove`].
    pub(crate) fn sweep(&mut self, group: u16, now: Timestamp, watermark: Timestamp) -> Result<()> {
        let now = self.expiry.observe(now, watermark);
        self.expiry.expired += self.store.retain_group(group, |e| e.live(now))?;
        Ok(())
    }
}

impl<K: Key, UK: Key, UV: Data> KeyedState for TtlMapStore<K, UK, UV> {
    fn snapshot_at(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        self.store.snapshot_at(operator, at)
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        let mut live = live_entries(entries, self.expiry.restore_now(), &mut self.expiry.expired);
        self.store.import_part(operator, &mut live, removed)
    }

    fn expired_before(&self) -> Option<Timestamp> {
        self.expiry.recorded()
    }

    fn restoring(&mut self, clock: Option<Timestamp>) {
        self.expiry.restoring(clock);
    }

    fn stats(&self) -> StateStats {
        self.expiry.stats(self.store.stats())
    }
}

/// List state with a time-to-live per element.
pub struct TtlListStore<K, T> {
    store: ListStore<K, Expiring<T>>,
    expiry: Expiry,
}

impl<K: Key, T: Data> TtlListStore<K, T> {
    /// Opens the list state `scope` names on `backend`, its elements living
    /// as `ttl` says.
    ///
    /// # Errors
    /// As [`ListStore::open`].
    pub(crate) fn open(backend: &dyn StateBackend, scope: &StateScope, ttl: StateTtl, clock: Now) -> Result<Self> {
        let (store, expiry) = Expiry::open(backend, scope, ttl, clock, ListStore::open)?;
        Ok(Self { store, expiry })
    }

    /// The time-to-live's clock at processing time `now` and `watermark`.
    pub(crate) fn now(&mut self, now: Timestamp, watermark: Timestamp) -> Timestamp {
        self.expiry.now(now, watermark)
    }

    /// Moves the clock the backend drops expired entries by to processing
    /// time `now` and watermark `watermark`.
    pub(crate) fn observe(&mut self, now: Timestamp, watermark: Timestamp) {
        self.expiry.observe(now, watermark);
    }

    /// Appends `value`, expiring `ttl` from `now`.
    ///
    /// # Errors
    /// As [`ListStore::add`].
    pub(crate) fn add(&mut self, group: u16, key: &K, key_bytes: &[u8], value: T, now: Timestamp) -> Result<()> {
        let expires = self.expiry.ttl.expiry(now);
        self.store.add(group, key, key_bytes, Expiring { expires, value })
    }

    /// Calls `f` with the live elements at `now`, in order, until it
    /// returns false; removes the expired ones it passes, and refreshes the
    /// ones it reads if reads refresh.
    ///
    /// # Errors
    /// As [`ListStore::for_each`].
    pub(crate) fn for_each(
        &mut self,
        group: u16,
        key: &K,
        key_bytes: &[u8],
        now: Timestamp,
        mut f: impl FnMut(T) -> bool,
    ) -> Result<()> {
        let (mut gone, mut read) = (Vec::new(), Vec::new());
        let on_read = self.expiry.ttl.on_read;
        let all = (Bound::Unbounded, Bound::Unbounded);
        self.store.entries_mut().for_each(group, key, key_bytes, &all, |seq, e| {
            if !e.live(now) {
                gone.push(seq);
                return true;
            }
            if on_read {
                read.push(seq);
            }
            f(e.value)
        })?;
        let expires = self.expiry.ttl.expiry(now);
        let entries = self.store.entries_mut();
        for seq in gone {
            entries.remove(group, key, key_bytes, seq)?;
            self.expiry.expired += 1;
        }
        for seq in read {
            entries.update(group, key, key_bytes, seq, |slot| {
                if let Some(e) = slot {
                    e.expires = expires;
                }
            })?;
        }
        Ok(())
    }

    /// Removes `key`'s elements.
    ///
    /// # Errors
    /// As [`ListStore::clear`].
    pub(crate) fn clear(&mut self, group: u16, key: &K, key_bytes: &[u8]) -> Result<()> {
        self.store.clear(group, key, key_bytes)
    }

    /// Removes the elements of key group `group` that have expired.
    ///
    /// # Errors
    /// As [`ListStore::clear`].
    pub(crate) fn sweep(&mut self, group: u16, now: Timestamp, watermark: Timestamp) -> Result<()> {
        let now = self.expiry.observe(now, watermark);
        self.expiry.expired += self.store.entries_mut().retain_group(group, |e| e.live(now))?;
        Ok(())
    }
}

impl<K: Key, T: Data> KeyedState for TtlListStore<K, T> {
    fn snapshot_at(&mut self, operator: &str, at: Option<Barrier>) -> Result<Snapshot> {
        self.store.snapshot_at(operator, at)
    }

    fn import_part(&mut self, operator: &str, entries: &mut [EntryRef<'_>], removed: &[RemovedRef<'_>]) -> Result<()> {
        let mut live = live_entries(entries, self.expiry.restore_now(), &mut self.expiry.expired);
        self.store.import_part(operator, &mut live, removed)
    }

    fn expired_before(&self) -> Option<Timestamp> {
        self.expiry.recorded()
    }

    fn restoring(&mut self, clock: Option<Timestamp>) {
        self.expiry.restoring(clock);
    }

    fn stats(&self) -> StateStats {
        self.expiry.stats(self.store.stats())
    }
}
