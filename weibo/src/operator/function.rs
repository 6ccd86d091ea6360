//! Keyed process functions with named state: the states a function
//! declares when the job is wired ([`States`]), the handles it keeps
//! ([`ValueState`], [`ListState`], [`MapState`], [`ReducingState`],
//! [`AggregatingState`]), what it sees per record or timer
//! ([`ProcessContext`]), the trait a larger function implements
//! ([`KeyedProcessFunction`]), and the operator that runs it.
//!
//! Each declared state is a state of its own in checkpoints (under its
//! name, with its own codec and schema), in the inspector and in the state
//! processor; a savepoint restores each by name, and a state the job no
//! longer declares is refused unless the job allows unrestored state.

use std::any::Any;
use std::fmt::{self, Display};
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::codec::Data;
use crate::codec::key::Key;
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::operator::broadcast::{Broadcast, BroadcastContext, BroadcastReadContext, BroadcastState, BroadcastStore};
use crate::operator::factory::{KeyedFactory, keyed_factory};
use crate::operator::keyed::{TIMERS, take_records};
use crate::operator::outputs::{OutputTag, Outputs, Sides, open_process_outputs};
use crate::operator::policy::{Failures, Policy};
use crate::operator::{Aggregate, Consumer, InputOperator, OpInfo, SnapshotAt, emit};
use crate::operator::{restore_state, snapshot_state};
use crate::record::CheckpointId;
use crate::record::{Batch, Meta, RecordBatch, Timestamp};
use crate::state::{ByteRange, Expiring, KeyedState, ListStore, MapStore, RestoreSource, StateBackend, StateScope};
use crate::state::{StateSnapshot, StateStats, StateType, TimerState, ValueStore, encoded_range, prefix_range};
use crate::state::{StateTtl, TtlListStore, TtlMapStore, TtlValueStore};
use crate::time::clock::Clock;
use crate::time::watermarks::InputTime;

/// Names the functions' own states use; a declared state may not take them.
const RESERVED: [&str; 2] = ["timers", "processing_timers"];

/// Tells apart the declarations of different operators, so that a handle
/// used on an operator that did not declare it is an error, not another
/// state's data.
static DECLARATIONS: AtomicU32 = AtomicU32::new(1);

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident<$($t:ident),+>) => {
        $(#[$doc])*
        pub struct $name<$($t),+> {
            owner: u32,
            index: usize,
            /// Whether the state was declared with a time-to-live.
            ttl: bool,
            _types: PhantomData<fn() -> ($($t,)+)>,
        }

        impl<$($t),+> Clone for $name<$($t),+> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<$($t),+> Copy for $name<$($t),+> {}

        impl<$($t),+> fmt::Debug for $name<$($t),+> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name)).field("index", &self.index).finish_non_exhaustive()
            }
        }
    };
}

handle!(
    /// A handle on one value per key, declared with [`States::value`]; read
    /// and written through [`ProcessContext::value`].
    ValueState<T>
);
handle!(
    /// A handle on a list per key, declared with [`States::list`]; read and
    /// written through [`ProcessContext::list`]. Adding reads nothing.
    ListState<T>
);
handle!(
    /// A handle on a map per key, declared with [`States::map`]; read and
    /// written an entry at a time through [`ProcessContext::map`].
    MapState<UK, UV>
);
handle!(
    /// A handle on a value per key that added values are reduced into,
    /// declared with [`States::reducing`]; used through
    /// [`ProcessContext::reducing`].
    ReducingState<T>
);
handle!(
    /// A handle on an accumulator per key that added values are aggregated
    /// into, declared with [`States::aggregating`]; used through
    /// [`ProcessContext::aggregating`].
    AggregatingState<T, A>
);

/// Opens one declared state for an operator instance.
type Open<K> = Arc<dyn Fn(&dyn StateBackend, &StateScope, &Clock) -> Result<Box<dyn NamedStore<K>>> + Send + Sync>;

/// One declared state: its name, what its values are, how to open it.
struct Declared<K> {
    name: String,
    ty: StateType,
    open: Open<K>,
    /// A broadcast state: one copy per instance, restored from every key
    /// group (see [`crate::operator::broadcast`]).
    broadcast: bool,
}

impl<K> Clone for Declared<K> {
    fn clone(&self) -> Self {
        Self { name: self.name.clone(), ty: self.ty.clone(), open: self.open.clone(), broadcast: self.broadcast }
    }
}

/// The states a keyed process function declares, by name, when the job is
/// wired: each call returns the handle the function keeps to reach the
/// state of the current key at run time.
///
/// A name is letters, digits and `_` (it names the state's files in a
/// checkpoint), unique in the operator; `timers` and `processing_timers`
/// are the operator's own.
/// A name is what a savepoint restores the state by: renaming a state
/// drops the old one (refused on restore unless the job allows
/// unrestored state).
///
/// ```
/// use weibo::on_error;
///
/// let out = weibo::testing::run(vec![("a".to_string(), 5u32), ("a".to_string(), 7), ("b".to_string(), 1)], |s| {
///     s.key_by(|r: &(String, u32)| r.0.clone()).process_with_state(
///         on_error::Fail,
///         |states| (states.value::<u32>("count"), states.list::<u32>("seen")),
///         |ctx, (count, seen), r| {
///             let n = ctx.value(count).get().unwrap_or(0) + 1;
///             ctx.value(count).set(n);
///             ctx.list(seen).add(r.1);
///             let all = ctx.list(seen).get();
///             let line = format!("{} #{n}: {all:?}", ctx.key());
///             ctx.emit(line);
///         },
///     )
/// })?;
/// assert_eq!(out, vec!["a #1: [5]", "a #2: [5, 7]", "b #1: [1]"]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct States<K> {
    owner: u32,
    declared: Vec<Declared<K>>,
    outputs: Outputs,
    errors: Vec<String>,
    /// The time-to-live for the next state declared.
    ttl: Option<StateTtl>,
    /// The version of the next state declared.
    version: Option<u32>,
}

impl<K> fmt::Debug for States<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.declared.iter().map(|d| d.name.as_str()).collect();
        f.debug_struct("States").field("declared", &names).finish_non_exhaustive()
    }
}

impl<K: Key> States<K> {
    pub(crate) fn new() -> Self {
        Self {
            owner: DECLARATIONS.fetch_add(1, Ordering::Relaxed),
            declared: Vec::new(),
            outputs: Outputs::new(),
            errors: Vec::new(),
            ttl: None,
            version: None,
        }
    }

    /// Gives the next state declared a time-to-live: its values (a list's
    /// elements, a map's entries) expire as `ttl` says and are never
    /// returned once expired (see [`StateTtl`]). Every kind of state takes
    /// one: a reducing or aggregating state's accumulator expires whole
    /// (adding to it is a write; reading it, a read), and the next value
    /// added starts a new one.
    ///
    /// A time-to-live is part of the state's layout: adding or removing
    /// one is a change of type, which a restore refuses.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::{on_error, process::StateTtl};
    ///
    /// // Drop repeated ids, remembering each for an hour after it was seen.
    /// let ids = vec![(1u32, "a".to_string()), (1, "a".to_string()), (1, "b".to_string())];
    /// let out = weibo::testing::run(ids, |s| {
    ///     s.key_by(|r: &(u32, String)| r.0).process_with_state(
    ///         on_error::Fail,
    ///         |states| states.ttl(StateTtl::after_write(Duration::from_secs(3_600))).map::<String, ()>("seen"),
    ///         |ctx, seen, r| {
    ///             let id = r.1.clone();
    ///             if !ctx.map(seen).contains(&id) {
    ///                 ctx.map(seen).put(id.clone(), ());
    ///                 ctx.emit(id);
    ///             }
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out, vec!["a".to_string(), "b".to_string()]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn ttl(&mut self, ttl: StateTtl) -> &mut Self {
        self.ttl = Some(ttl);
        self
    }

    /// Gives the next state declared a version of its own (from 1), in
    /// place of the operator's (`.state_version(n)`, which versions all of
    /// its states together). When the version in a checkpoint differs,
    /// the restore migrates that state alone, through a migration of its
    /// type (`Job::with_state_migration_for` the operator: its values'
    /// meaning changed, even if their layout did not); a checkpoint of a
    /// later version is refused.
    ///
    /// ```
    /// use weibo::on_error;
    ///
    /// // `total` now counts cents (version 2); `count` is as it was.
    /// let out = weibo::testing::run(vec![(1u32, 5u64)], |s| {
    ///     s.key_by(|r: &(u32, u64)| r.0).process_with_state(
    ///         on_error::Fail,
    ///         |states| (states.value::<u64>("count"), states.version(2).value::<u64>("total")),
    ///         |ctx, (count, total), r| {
    ///             ctx.value(count).update(|n| *n = Some(n.unwrap_or(0) + 1));
    ///             ctx.value(total).update(|t| *t = Some(t.unwrap_or(0) + r.1 * 100));
    ///             let total = ctx.value(total).get();
    ///             ctx.emit(total);
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out, vec![Some(500)]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn version(&mut self, version: u32) -> &mut Self {
        if version == 0 {
            self.errors.push("`States::version(0)`: state versions start at 1".to_string());
        }
        self.version = Some(version.max(1));
        self
    }

    /// Records a state; its index in the operator's stores.
    fn declare(&mut self, name: &str, mut ty: StateType, open: Open<K>) -> usize {
        ty.version = self.version.take();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !RESERVED.contains(&name);
        if !valid {
            self.errors.push(format!(
                "state name `{name}` is not allowed: use 1 to 64 letters, digits and `_` (it names the state's files), \
                 and not `timers` or `processing_timers`, which the operator keeps for itself"
            ));
        } else if self.declared.iter().any(|d| d.name.eq_ignore_ascii_case(name)) {
            // Case apart too: the names name files, on file systems that
            // may not tell `a` from `A`.
            self.errors.push(format!("state `{name}` is declared twice: give each state its own name"));
        }
        self.declared.push(Declared { name: name.to_string(), ty, open, broadcast: false });
        self.declared.len() - 1
    }

    /// Declares a broadcast map named `name`: one map per operator
    /// instance, not per key, written by the records of the operator's
    /// broadcast input and read by its keyed records (see
    /// [`KeyedStream::connect_broadcast`](crate::KeyedStream::connect_broadcast)).
    /// It takes no time-to-live.
    pub fn broadcast<UK: Key, UV: Data>(&mut self, name: &str) -> BroadcastState<UK, UV> {
        if self.ttl.take().is_some() {
            self.errors.push(format!("broadcast state `{name}` cannot have a time-to-live"));
        }
        let open: Open<K> = Arc::new(|_, scope, _| Ok(Box::new(BroadcastStore::<UK, UV>::new(scope.key_groups.start))));
        let index = self.declare(name, StateType::of::<UV>(), open);
        if let Some(d) = self.declared.get_mut(index) {
            d.broadcast = true;
        }
        BroadcastState { owner: self.owner, index, _types: PhantomData }
    }

    /// Declares a value per key named `name`.
    pub fn value<T: Data>(&mut self, name: &str) -> ValueState<T> {
        let (index, ttl) = match self.ttl.take() {
            None => {
                let open: Open<K> =
                    Arc::new(|backend, scope, _| Ok(Box::new(ValueStore::<K, T>::open(backend, scope)?)));
                (self.declare(name, StateType::of::<T>(), open), false)
            }
            Some(ttl) => {
                let open: Open<K> = Arc::new(move |backend, scope, clock| {
                    Ok(Box::new(TtlValueStore::<K, T>::open(backend, scope, ttl, clock.reading())?))
                });
                (self.declare(name, StateType::of::<Expiring<T>>(), open), true)
            }
        };
        ValueState { owner: self.owner, index, ttl, _types: PhantomData }
    }

    /// Declares a list per key named `name`.
    pub fn list<T: Data>(&mut self, name: &str) -> ListState<T> {
        let (index, ttl) = match self.ttl.take() {
            None => {
                let open: Open<K> =
                    Arc::new(|backend, scope, _| Ok(Box::new(ListStore::<K, T>::open(backend, scope)?)));
                (self.declare(name, StateType::of::<T>(), open), false)
            }
            Some(ttl) => {
                let open: Open<K> = Arc::new(move |backend, scope, clock| {
                    Ok(Box::new(TtlListStore::<K, T>::open(backend, scope, ttl, clock.reading())?))
                });
                (self.declare(name, StateType::of::<Expiring<T>>(), open), true)
            }
        };
        ListState { owner: self.owner, index, ttl, _types: PhantomData }
    }

    /// Declares a map per key named `name`, from user keys `UK` (any
    /// [`Key`]: its entries iterate in the order of the user keys'
    /// encoding, which for integers and strings is their natural order) to
    /// values `UV`.
    pub fn map<UK: Key, UV: Data>(&mut self, name: &str) -> MapState<UK, UV> {
        let (index, ttl) = match self.ttl.take() {
            None => {
                let open: Open<K> =
                    Arc::new(|backend, scope, _| Ok(Box::new(MapStore::<K, UK, UV>::open(backend, scope)?)));
                (self.declare(name, StateType::of::<UV>(), open), false)
            }
            Some(ttl) => {
                let open: Open<K> = Arc::new(move |backend, scope, clock| {
                    Ok(Box::new(TtlMapStore::<K, UK, UV>::open(backend, scope, ttl, clock.reading())?))
                });
                (self.declare(name, StateType::of::<Expiring<UV>>(), open), true)
            }
        };
        MapState { owner: self.owner, index, ttl, _types: PhantomData }
    }

    /// The accumulators of a reducing or aggregating state named `name`,
    /// with the time-to-live set for it if any: how to open them, their
    /// type in checkpoints, and whether they expire.
    fn accumulators<A: Data>(&mut self) -> (OpenAccumulators<K, A>, StateType, bool) {
        match self.ttl.take() {
            None => {
                let open: OpenAccumulators<K, A> =
                    Arc::new(|backend, scope, _| Ok(Accumulators::Plain(ValueStore::open(backend, scope)?)));
                (open, StateType::of::<A>(), false)
            }
            Some(ttl) => {
                let open: OpenAccumulators<K, A> = Arc::new(move |backend, scope, clock| {
                    Ok(Accumulators::Expiring(TtlValueStore::open(backend, scope, ttl, clock.reading())?))
                });
                (open, StateType::of::<Expiring<A>>(), true)
            }
        }
    }

    /// Declares a value per key named `name` that each added value is
    /// combined into with `f` (the first one added is kept as it is).
    pub fn reducing<T: Data>(&mut self, name: &str, f: impl Fn(T, T) -> T + Send + Sync + 'static) -> ReducingState<T> {
        let (accumulators, ty, ttl) = self.accumulators::<T>();
        let f: Arc<dyn Fn(T, T) -> T + Send + Sync> = Arc::new(f);
        let open: Open<K> = Arc::new(move |backend, scope, clock| {
            Ok(Box::new(ReducingStore::<K, T> { values: accumulators(backend, scope, clock)?, f: f.clone() }))
        });
        let index = self.declare(name, ty, open);
        ReducingState { owner: self.owner, index, ttl, _types: PhantomData }
    }

    /// Declares an accumulator per key named `name`, kept by `aggregate`
    /// (the [`Aggregate`] windows use): added values go into it, and
    /// reading it gives the aggregate's result.
    pub fn aggregating<T, A>(&mut self, name: &str, aggregate: A) -> AggregatingState<T, A>
    where
        T: 'static,
        A: Aggregate<T>,
    {
        let (accumulators, ty, ttl) = self.accumulators::<A::Acc>();
        let aggregate = Arc::new(aggregate);
        let open: Open<K> = Arc::new(move |backend, scope, clock| {
            Ok(Box::new(AggregatingStore::<K, T, A> {
                values: accumulators(backend, scope, clock)?,
                aggregate: aggregate.clone(),
                _input: PhantomData,
            }))
        });
        let index = self.declare(name, ty, open);
        AggregatingState { owner: self.owner, index, ttl, _types: PhantomData }
    }

    /// Declares that the function sends to side output `tag` (see
    /// [`OutputTag`]); returns the tag, for the function to keep.
    ///
    /// ```
    /// use weibo::{on_error, process::OutputTag};
    ///
    /// // Large amounts go on; small ones go to a side output of their own type.
    /// let mut t = weibo::testing::TestJob::new("split");
    /// let small = OutputTag::<String>::new("small");
    /// let large = t.input(vec![("a".to_string(), 5u32), ("a".to_string(), 500)])
    ///     .key_by(|r: &(String, u32)| r.0.clone())
    ///     .process_with_state(
    ///         on_error::Fail,
    ///         |states| states.side_output(&small),
    ///         |ctx, small, r| {
    ///             if r.1 < 100 {
    ///                 ctx.output(small, format!("{} small", r.0));
    ///             } else {
    ///                 ctx.emit(r.1);
    ///             }
    ///         },
    ///     );
    /// let smalls = large.side_output(&small);
    /// let (large, smalls) = (t.collect(&large), t.collect(&smalls));
    /// t.run()?;
    /// assert_eq!(large.values(), vec![500]);
    /// assert_eq!(smalls.values(), vec!["a small".to_string()]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn side_output<V: Clone + Send + 'static>(&mut self, tag: &OutputTag<V>) -> OutputTag<V> {
        self.outputs.side_output(tag)
    }

    /// Declares the operator's late records output (a join's).
    pub(crate) fn late_records<V: Clone + Send + 'static>(&mut self) -> OutputTag<V> {
        self.outputs.late_records()
    }

    /// The declared side outputs.
    pub(crate) fn outputs(&self) -> &Outputs {
        &self.outputs
    }

    /// The declared states' names (for the plan), and the wiring errors.
    pub(crate) fn finish(&self) -> (Vec<String>, Vec<String>) {
        let mut errors = self.errors.clone();
        errors.extend(self.outputs.errors().iter().cloned());
        if self.version.is_some() {
            errors.push(
                "`States::version` was not followed by the declaration of a state: a version applies to the next \
                 state declared"
                    .to_string(),
            );
        }
        if self.ttl.is_some() {
            errors.push(
                "`States::ttl` was not followed by the declaration of a state: a time-to-live applies to the next \
                 state declared"
                    .to_string(),
            );
        }
        (self.declared.iter().map(|d| d.name.clone()).collect(), errors)
    }
}

/// A declared state's store as the operator holds it: checkpointed,
/// restored and measured like any keyed state, and reached by handle.
pub(crate) trait NamedStore<K>: KeyedState + Send {
    fn as_any(&mut self) -> &mut dyn Any;

    /// Whether its values expire (and key groups are to be swept).
    fn expires(&self) -> bool {
        false
    }

    /// Removes what has expired in key group `group`, at processing time
    /// `now` and watermark `watermark`.
    ///
    /// # Errors
    /// [`Error::State`] when the backend fails.
    fn sweep(&mut self, group: u16, now: Timestamp, watermark: Timestamp) -> Result<()> {
        let _ = (group, now, watermark);
        Ok(())
    }

    /// Moves its time-to-live's clock to processing time `now` and
    /// watermark `watermark` (before a barrier: the clock a checkpoint
    /// records).
    fn observe(&mut self, now: Timestamp, watermark: Timestamp) {
        let _ = (now, watermark);
    }
}

macro_rules! expiring_store {
    ($store:ident<$($t:ident),+> where $($bound:tt)*) => {
        impl<K: Key, $($bound)*> NamedStore<K> for $store<K, $($t),+> {
            fn as_any(&mut self) -> &mut dyn Any {
                self
            }
            fn expires(&self) -> bool {
                true
            }
            fn sweep(&mut self, group: u16, now: Timestamp, watermark: Timestamp) -> Result<()> {
                $store::sweep(self, group, now, watermark)
            }
            fn observe(&mut self, now: Timestamp, watermark: Timestamp) {
                $store::observe(self, now, watermark);
            }
        }
    };
}

expiring_store!(TtlValueStore<T> where T: Data);
expiring_store!(TtlListStore<T> where T: Data);
expiring_store!(TtlMapStore<UK, UV> where UK: Key, UV: Data);

impl<K: Key, T: Data> NamedStore<K> for ValueStore<K, T> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

impl<K: Key, T: Data> NamedStore<K> for ListStore<K, T> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

impl<K: Key, UK: Key, UV: Data> NamedStore<K> for MapStore<K, UK, UV> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

/// Opens the accumulators of a reducing or aggregating state.
type OpenAccumulators<K, A> =
    Arc<dyn Fn(&dyn StateBackend, &StateScope, &Clock) -> Result<Accumulators<K, A>> + Send + Sync>;

/// The accumulators of a reducing or aggregating state, one per key:
/// without a time-to-live, or with one (an expired accumulator reads as
/// none, and the next value added starts a new one).
enum Accumulators<K, A> {
    Plain(ValueStore<K, A>),
    Expiring(TtlValueStore<K, A>),
}

impl<K: Key, A: Data> Accumulators<K, A> {
    /// Changes the current key's accumulator in place.
    fn update(&mut self, at: &At<'_, K>, f: impl FnOnce(&mut Option<A>)) -> Result<()> {
        match self {
            Self::Plain(s) => s.update(at.group, at.key.clone(), at.key_bytes, f),
            Self::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.update(at.group, at.key, at.key_bytes, now, f)
            }
        }
    }

    /// The current key's accumulator, if any (and live).
    fn get(&mut self, at: &At<'_, K>) -> Result<Option<A>> {
        match self {
            Self::Plain(s) => s.get(at.group, at.key, at.key_bytes),
            Self::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.get(at.group, at.key, at.key_bytes, now)
            }
        }
    }

    fn expires(&self) -> bool {
        matches!(self, Self::Expiring(_))
    }

    fn sweep(&mut self, group: u16, now: Timestamp, watermark: Timestamp) -> Result<()> {
        match self {
            Self::Plain(_) => Ok(()),
            Self::Expiring(s) => s.sweep(group, now, watermark),
        }
    }

    fn observe(&mut self, now: Timestamp, watermark: Timestamp) {
        if let Self::Expiring(s) = self {
            s.observe(now, watermark);
        }
    }
}

impl<K: Key, A: Data> KeyedState for Accumulators<K, A> {
    fn snapshot_at(&mut self, operator: &str, at: Option<crate::state::Barrier>) -> Result<crate::state::Snapshot> {
        match self {
            Self::Plain(s) => KeyedState::snapshot_at(s, operator, at),
            Self::Expiring(s) => KeyedState::snapshot_at(s, operator, at),
        }
    }
    fn import_part(
        &mut self,
        operator: &str,
        entries: &mut [crate::state::EntryRef<'_>],
        removed: &[crate::state::RemovedRef<'_>],
    ) -> Result<()> {
        match self {
            Self::Plain(s) => KeyedState::import_part(s, operator, entries, removed),
            Self::Expiring(s) => KeyedState::import_part(s, operator, entries, removed),
        }
    }
    fn stats(&self) -> StateStats {
        match self {
            Self::Plain(s) => KeyedState::stats(s),
            Self::Expiring(s) => KeyedState::stats(s),
        }
    }
    fn expired_before(&self) -> Option<Timestamp> {
        match self {
            Self::Plain(_) => None,
            Self::Expiring(s) => s.expired_before(),
        }
    }
    fn restoring(&mut self, clock: Option<Timestamp>) {
        if let Self::Expiring(s) = self {
            s.restoring(clock);
        }
    }
}

/// Reducing state: a value and the function added values are reduced with.
struct ReducingStore<K, T> {
    values: Accumulators<K, T>,
    f: Arc<dyn Fn(T, T) -> T + Send + Sync>,
}

/// Aggregating state: an accumulator and the aggregate that keeps it.
struct AggregatingStore<K, T, A: Aggregate<T>> {
    values: Accumulators<K, A::Acc>,
    aggregate: Arc<A>,
    _input: PhantomData<fn(T)>,
}

/// The keyed-state and named-store plumbing of a store of accumulators.
macro_rules! accumulating_store {
    ($store:ident<$($t:ident),+> where $($bound:tt)*) => {
        impl<K: Key, $($bound)*> KeyedState for $store<K, $($t),+> {
            fn snapshot_at(
                &mut self,
                operator: &str,
                at: Option<crate::state::Barrier>,
            ) -> Result<crate::state::Snapshot> {
                KeyedState::snapshot_at(&mut self.values, operator, at)
            }
            fn import_part(
                &mut self,
                operator: &str,
                entries: &mut [crate::state::EntryRef<'_>],
                removed: &[crate::state::RemovedRef<'_>],
            ) -> Result<()> {
                KeyedState::import_part(&mut self.values, operator, entries, removed)
            }
            fn stats(&self) -> StateStats {
                KeyedState::stats(&self.values)
            }
            fn expired_before(&self) -> Option<Timestamp> {
                self.values.expired_before()
            }
            fn restoring(&mut self, clock: Option<Timestamp>) {
                self.values.restoring(clock);
            }
        }

        impl<K: Key, $($bound)*> NamedStore<K> for $store<K, $($t),+> {
            fn as_any(&mut self) -> &mut dyn Any {
                self
            }
            fn expires(&self) -> bool {
                self.values.expires()
            }
            fn sweep(&mut self, group: u16, now: Timestamp, watermark: Timestamp) -> Result<()> {
                self.values.sweep(group, now, watermark)
            }
            fn observe(&mut self, now: Timestamp, watermark: Timestamp) {
                self.values.observe(now, watermark);
            }
        }
    };
}

accumulating_store!(ReducingStore<T> where T: Data);
accumulating_store!(AggregatingStore<T, A> where T: 'static, A: Aggregate<T>);

/// Where a state access goes: the current key, the times a time-to-live
/// is measured in, and where a failure of the state backend is kept until
/// the function returns.
struct At<'c, K> {
    key: &'c K,
    key_bytes: &'c [u8],
    group: u16,
    /// Processing time, and the operator's watermark.
    now: Timestamp,
    watermark: Timestamp,
    error: &'c mut Option<Error>,
}

impl<K> At<'_, K> {
    /// `r`'s value; a failure is kept (the first one) and the operator
    /// stops the job with it once the function returns.
    fn keep<R>(&mut self, r: Result<R>) -> Option<R> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.error.get_or_insert(e);
                None
            }
        }
    }
}

/// A declared state's store as an access finds it: without a time-to-live,
/// with one, or not there (a handle of another operator: the access does
/// nothing, and the error is kept).
enum Slot<'c, P, E> {
    Plain(&'c mut P),
    Expiring(&'c mut E),
    Missing,
}

/// A key's value in a [`ValueState`], from [`ProcessContext::value`].
pub struct Value<'c, K, T> {
    store: Slot<'c, ValueStore<K, T>, TtlValueStore<K, T>>,
    at: At<'c, K>,
}

impl<K: Key, T: Data> Value<'_, K, T> {
    /// The value, if set (and, with a time-to-live, not expired).
    pub fn get(&mut self) -> Option<T> {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.get(at.group, at.key, at.key_bytes),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.get(at.group, at.key, at.key_bytes, now)
            }
            Slot::Missing => return None,
        };
        at.keep(r).flatten()
    }

    /// Calls `f` with the value, if set (and not expired), and returns what
    /// it returns: a read, as [`get`](Self::get). On the in-memory backend,
    /// for a state without a time-to-live, it copies nothing (a large value,
    /// such as a list kept whole, is read in place); elsewhere `f` reads a
    /// copy.
    ///
    /// ```
    /// use weibo::on_error;
    ///
    /// // Each key's words kept whole; a record says how many it has.
    /// let out = weibo::testing::run(vec![(1u32, "a"), (1, "b"), (2, "c")], |s| {
    ///     s.map(|(k, w): (u32, &str)| (k, w.to_string())).key_by(|r: &(u32, String)| r.0).process_with_state(
    ///         on_error::Fail,
    ///         |states| states.value::<Vec<String>>("words"),
    ///         |ctx, words, r| {
    ///             ctx.value(words).update(|w| w.get_or_insert_with(Vec::new).push(r.1.clone()));
    ///             let n = ctx.value(words).read(|w| w.map_or(0, Vec::len));
    ///             ctx.emit((r.0, n));
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out, vec![(1, 1), (1, 2), (2, 1)]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn read<R>(&mut self, f: impl FnOnce(Option<&T>) -> R) -> R {
        let at = &mut self.at;
        let mut f = Some(f);
        let r = match &mut self.store {
            Slot::Plain(s) => s.read(at.group, at.key, at.key_bytes, |v| f.take().map(|f| f(v))),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.get(at.group, at.key, at.key_bytes, now).map(|v| f.take().map(|f| f(v.as_ref())))
            }
            Slot::Missing => Ok(None),
        };
        match (at.keep(r).flatten(), f) {
            (Some(r), _) => r,
            // Not called (the state failed, as `get` does): called with none.
            (None, Some(f)) => f(None),
            (None, None) => unreachable!("`f` is called once, and its result kept"),
        }
    }

    /// Sets the value.
    pub fn set(&mut self, value: T) {
        self.update(|slot| *slot = Some(value));
    }

    /// Removes the value.
    pub fn clear(&mut self) {
        self.update(|slot| *slot = None);
    }

    /// Changes the value in place: `f` gets it (`None` if unset), and what
    /// it leaves is stored (`None` clears it). In memory nothing is copied.
    pub fn update(&mut self, f: impl FnOnce(&mut Option<T>)) {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.update(at.group, at.key.clone(), at.key_bytes, f),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.update(at.group, at.key, at.key_bytes, now, f)
            }
            Slot::Missing => return,
        };
        at.keep(r);
    }
}

/// A key's list in a [`ListState`], from [`ProcessContext::list`].
pub struct List<'c, K, T> {
    store: Slot<'c, ListStore<K, T>, TtlListStore<K, T>>,
    at: At<'c, K>,
}

impl<K: Key, T: Data> List<'_, K, T> {
    /// Appends `value`, reading nothing.
    pub fn add(&mut self, value: T) {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.add(at.group, at.key, at.key_bytes, value),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.add(at.group, at.key, at.key_bytes, value, now)
            }
            Slot::Missing => return,
        };
        at.keep(r);
    }

    /// Appends every value of `values`, in order.
    pub fn add_all(&mut self, values: impl IntoIterator<Item = T>) {
        for v in values {
            self.add(v);
        }
    }

    /// The list's elements, in the order they were added.
    pub fn get(&mut self) -> Vec<T> {
        let mut all = Vec::new();
        self.for_each(|v| {
            all.push(v);
            true
        });
        all
    }

    /// Calls `f` with the elements in order, read a chunk at a time, until
    /// it returns false: a long list is never loaded whole.
    pub fn for_each(&mut self, f: impl FnMut(T) -> bool) {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.for_each(at.group, at.key, at.key_bytes, f),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.for_each(at.group, at.key, at.key_bytes, now, f)
            }
            Slot::Missing => return,
        };
        at.keep(r);
    }

    /// Replaces the list with `values`.
    pub fn update(&mut self, values: impl IntoIterator<Item = T>) {
        self.clear();
        self.add_all(values);
    }

    /// Empties the list.
    pub fn clear(&mut self) {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.clear(at.group, at.key, at.key_bytes),
            Slot::Expiring(s) => s.clear(at.group, at.key, at.key_bytes),
            Slot::Missing => return,
        };
        at.keep(r);
    }

    /// Whether the list is empty.
    pub fn is_empty(&mut self) -> bool {
        let mut empty = true;
        self.for_each(|_| {
            empty = false;
            false
        });
        empty
    }
}

/// A key's map in a [`MapState`], from [`ProcessContext::map`]. Entries
/// are read and written one at a time; iteration goes in the order of the
/// user keys' encoding, a chunk at a time.
pub struct Map<'c, K, UK, UV> {
    store: Slot<'c, MapStore<K, UK, UV>, TtlMapStore<K, UK, UV>>,
    at: At<'c, K>,
}

impl<K: Key, UK: Key, UV: Data> Map<'_, K, UK, UV> {
    /// The value at `user_key`, if any.
    pub fn get(&mut self, user_key: &UK) -> Option<UV> {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.get(at.group, at.key, at.key_bytes, user_key),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.get(at.group, at.key, at.key_bytes, user_key, now)
            }
            Slot::Missing => return None,
        };
        at.keep(r).flatten()
    }

    /// Whether the map has an entry at `user_key`.
    pub fn contains(&mut self, user_key: &UK) -> bool {
        self.get(user_key).is_some()
    }

    /// Sets the value at `user_key`, reading nothing.
    pub fn put(&mut self, user_key: UK, value: UV) {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.put(at.group, at.key, at.key_bytes, user_key, value),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.put(at.group, at.key, at.key_bytes, user_key, value, now)
            }
            Slot::Missing => return,
        };
        at.keep(r);
    }

    /// Changes the value at `user_key` in place: `f` gets it (`None` if
    /// absent) and what it leaves is stored (`None` removes the entry).
    pub fn update(&mut self, user_key: UK, f: impl FnOnce(&mut Option<UV>)) {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.update(at.group, at.key, at.key_bytes, user_key, f),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.update(at.group, at.key, at.key_bytes, user_key, now, f)
            }
            Slot::Missing => return,
        };
        at.keep(r);
    }

    /// Removes the entry at `user_key`, returning its value.
    pub fn remove(&mut self, user_key: &UK) -> Option<UV> {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.remove(at.group, at.key, at.key_bytes, user_key.clone()),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.remove(at.group, at.key, at.key_bytes, user_key.clone(), now)
            }
            Slot::Missing => return None,
        };
        at.keep(r).flatten()
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.clear(at.group, at.key, at.key_bytes),
            Slot::Expiring(s) => s.clear(at.group, at.key, at.key_bytes),
            Slot::Missing => return,
        };
        at.keep(r);
    }

    /// Whether the map has no entries.
    pub fn is_empty(&mut self) -> bool {
        let mut empty = true;
        self.for_each(|_, _| {
            empty = false;
            false
        });
        empty
    }

    /// Calls `f` with every entry in order until it returns false.
    pub fn for_each(&mut self, f: impl FnMut(UK, UV) -> bool) {
        self.scan(&(Bound::Unbounded, Bound::Unbounded), f);
    }

    /// Calls `f` with the entries whose user keys are in `range` (compared
    /// by their encoding, which for integers and strings is their natural
    /// order), in order, until it returns false.
    pub fn range(&mut self, range: impl RangeBounds<UK>, f: impl FnMut(UK, UV) -> bool) {
        self.scan(&encoded_range(&range), f);
    }

    /// Calls `f` with the entries whose user keys' encoding starts with
    /// `prefix`'s (for a tuple or struct user key: the entries whose first
    /// fields are `prefix`), in order, until it returns false.
    pub fn prefix<P: Key>(&mut self, prefix: &P, f: impl FnMut(UK, UV) -> bool) {
        self.scan(&prefix_range(prefix), f);
    }

    /// Every entry, in order (read a chunk at a time; for a map too large
    /// to hold, use [`Map::for_each`]).
    pub fn entries(&mut self) -> Vec<(UK, UV)> {
        let mut all = Vec::new();
        self.for_each(|k, v| {
            all.push((k, v));
            true
        });
        all
    }

    /// Every user key, in order.
    pub fn keys(&mut self) -> Vec<UK> {
        let mut all = Vec::new();
        self.for_each(|k, _| {
            all.push(k);
            true
        });
        all
    }

    fn scan(&mut self, range: &ByteRange, f: impl FnMut(UK, UV) -> bool) {
        let at = &mut self.at;
        let r = match &mut self.store {
            Slot::Plain(s) => s.for_each(at.group, at.key, at.key_bytes, range, f),
            Slot::Expiring(s) => {
                let now = s.now(at.now, at.watermark);
                s.for_each(at.group, at.key, at.key_bytes, range, now, f)
            }
            Slot::Missing => return,
        };
        at.keep(r);
    }
}

/// A key's reduced value in a [`ReducingState`], from
/// [`ProcessContext::reducing`].
pub struct Reducing<'c, K, T> {
    store: Option<&'c mut ReducingStore<K, T>>,
    at: At<'c, K>,
}

impl<K: Key, T: Data> Reducing<'_, K, T> {
    /// Reduces `value` into the state.
    pub fn add(&mut self, value: T) {
        if let Some(store) = self.store.as_mut() {
            let f = &*store.f;
            let r = store.values.update(&self.at, |slot| {
                *slot = Some(match slot.take() {
                    Some(acc) => f(acc, value),
                    None => value,
                });
            });
            self.at.keep(r);
        }
    }

    /// The reduced value, if anything was added.
    pub fn get(&mut self) -> Option<T> {
        let store = self.store.as_mut()?;
        let r = store.values.get(&self.at);
        self.at.keep(r).flatten()
    }

    /// Forgets what was added.
    pub fn clear(&mut self) {
        if let Some(store) = self.store.as_mut() {
            let r = store.values.update(&self.at, |slot| *slot = None);
            self.at.keep(r);
        }
    }
}

/// A key's accumulator in an [`AggregatingState`], from
/// [`ProcessContext::aggregating`].
pub struct Aggregating<'c, K, T, A: Aggregate<T>> {
    store: Option<&'c mut AggregatingStore<K, T, A>>,
    at: At<'c, K>,
}

impl<K: Key, T: 'static, A: Aggregate<T>> Aggregating<'_, K, T, A> {
    /// Adds `value` to the accumulator (created first if need be).
    pub fn add(&mut self, value: T) {
        if let Some(store) = self.store.as_mut() {
            let aggregate = &*store.aggregate;
            let r = store.values.update(&self.at, |slot| {
                aggregate.add(slot.get_or_insert_with(|| aggregate.create()), value);
            });
            self.at.keep(r);
        }
    }

    /// The aggregate's result, if anything was added.
    pub fn get(&mut self) -> Option<A::Out> {
        let store = self.store.as_mut()?;
        let r = store.values.get(&self.at);
        let acc = self.at.keep(r).flatten()?;
        Some(store.aggregate.result(&acc))
    }

    /// Forgets what was added.
    pub fn clear(&mut self) {
        if let Some(store) = self.store.as_mut() {
            let r = store.values.update(&self.at, |slot| *slot = None);
            self.at.keep(r);
        }
    }
}

/// Which clock a timer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeDomain {
    /// The operator's watermark: the timer fires when the watermark
    /// reaches its time.
    EventTime,
    /// The wall clock (milliseconds since the Unix epoch; in a test
    /// harness, the time the test sets): the timer fires once the clock
    /// has passed its time, within a buffer timeout.
    ProcessingTime,
}

/// A timer that fired: its time, and the clock it followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timer {
    /// The time it was set for (milliseconds).
    pub time: Timestamp,
    /// The clock it followed.
    pub domain: TimeDomain,
}

/// What a keyed process function sees for one record or one timer: the
/// key, the key's declared states, its timers, and where results go.
///
/// State reads and writes do not return errors: a failure of the state
/// backend (a disk error) is kept, the access gives what an empty state
/// would, and the operator stops the job with the failure as soon as the
/// function returns, without emitting what the function emitted.
pub struct ProcessContext<'a, K, U> {
    operator: &'a str,
    key: &'a K,
    key_bytes: &'a [u8],
    group: u16,
    owner: u32,
    stores: &'a mut [Box<dyn NamedStore<K>>],
    sides: &'a mut Sides,
    timers: &'a mut TimerState<K>,
    processing: &'a mut TimerState<K>,
    /// The processing time when the call began.
    now: Timestamp,
    error: &'a mut Option<Error>,
    out: &'a mut Batch<U>,
    meta: Meta,
    watermark: Timestamp,
}

impl<K, U> fmt::Debug for ProcessContext<'_, K, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessContext").field("meta", &self.meta).finish_non_exhaustive()
    }
}

impl<U> ProcessContext<'_, (), U> {
    /// The context of an operator whose main input is not keyed (of key
    /// `()`): what [`BroadcastReadContext`] lets its function reach.
    pub(crate) fn unkeyed(&mut self) -> BroadcastReadContext<'_, U> {
        BroadcastReadContext(BroadcastContext {
            operator: self.operator,
            owner: self.owner,
            stores: &mut *self.stores,
            sides: &mut *self.sides,
            error: &mut *self.error,
            out: &mut *self.out,
            meta: Meta { watermark: self.watermark, ..self.meta },
            now: self.now,
        })
    }
}

impl<K: Key, U> ProcessContext<'_, K, U> {
    /// The current key.
    pub fn key(&self) -> &K {
        self.key
    }

    /// Emits a result; it carries the input record's metadata (for a
    /// timer: the timer's time as timestamp).
    pub fn emit(&mut self, value: U) {
        self.out.push(value, self.meta);
    }

    /// Emits a result with event time `timestamp` instead of the input
    /// record's (a join's pair carries the later of its two records'
    /// times).
    pub fn emit_at(&mut self, value: U, timestamp: Timestamp) {
        self.out.push(value, Meta { timestamp, ..self.meta });
    }

    /// Sends `value` to the side output `tag`, with the metadata `emit`
    /// gives its results.
    pub fn output<V: Clone + Send + 'static>(&mut self, tag: &OutputTag<V>, value: V) {
        if let Err(e) = self.sides.send(tag, value, self.meta, self.operator) {
            self.error.get_or_insert(e);
        }
    }

    /// The record's event time (for a timer: the timer's time), if it has one.
    pub fn timestamp(&self) -> Option<Timestamp> {
        (self.meta.timestamp != crate::record::NO_TIMESTAMP).then_some(self.meta.timestamp)
    }

    /// The operator's watermark: event-time timers at or below it have
    /// fired (in `on_timer`: the watermark that fired the timer).
    pub fn watermark(&self) -> Timestamp {
        self.watermark
    }

    /// Calls `on_timer` for this key when the watermark reaches `time` (at
    /// once, at the next watermark, if it already has). Setting the same
    /// time twice sets one timer.
    pub fn register_timer(&mut self, time: Timestamp) {
        if let Err(e) = self.timers.register(time, self.group, self.key) {
            self.error.get_or_insert(e);
        }
    }

    /// Removes this key's event-time timer at `time`, if any.
    pub fn delete_timer(&mut self, time: Timestamp) {
        if let Err(e) = self.timers.delete(time, self.group, self.key) {
            self.error.get_or_insert(e);
        }
    }

    /// The processing time (milliseconds since the Unix epoch; in a test
    /// harness, the time the test set) when this call began.
    pub fn processing_time(&self) -> Timestamp {
        self.now
    }

    /// Calls `on_timer` for this key once the processing time passes
    /// `time` (within a buffer timeout; at once if it already has).
    /// Setting the same time twice sets one timer. Processing-time timers
    /// are checkpointed: one that came due while the job was down fires
    /// once after the restore.
    pub fn register_processing_timer(&mut self, time: Timestamp) {
        if let Err(e) = self.processing.register(time, self.group, self.key) {
            self.error.get_or_insert(e);
        }
    }

    /// Removes this key's processing-time timer at `time`, if any.
    pub fn delete_processing_timer(&mut self, time: Timestamp) {
        if let Err(e) = self.processing.delete(time, self.group, self.key) {
            self.error.get_or_insert(e);
        }
    }

    /// The store of a handle (`P` without a time-to-live, `E` with one),
    /// and the current key's address; a handle from another operator is
    /// kept as an error (the access then does nothing).
    fn slot<P: 'static, E: 'static>(
        &mut self,
        owner: u32,
        index: usize,
        ttl: bool,
        what: &str,
    ) -> (Slot<'_, P, E>, At<'_, K>) {
        let store = if owner == self.owner { self.stores.get_mut(index) } else { None };
        let slot = match store.map(|s| s.as_any()) {
            Some(any) if ttl => any.downcast_mut::<E>().map_or(Slot::Missing, Slot::Expiring),
            Some(any) => any.downcast_mut::<P>().map_or(Slot::Missing, Slot::Plain),
            None => Slot::Missing,
        };
        if matches!(slot, Slot::Missing) {
            let operator = self.operator;
            self.error.get_or_insert_with(|| Error::State {
                operator: operator.to_string(),
                message: format!(
                    "a {what} handle was used on an operator that did not declare it: each operator reaches only \
                     the states its own declaration returned"
                ),
                source: None,
            });
        }
        let at = At {
            key: self.key,
            key_bytes: self.key_bytes,
            group: self.group,
            now: self.now,
            watermark: self.watermark,
            error: &mut *self.error,
        };
        (slot, at)
    }

    /// This instance's copy of the broadcast map `state`, to read (the
    /// broadcast input's function writes it).
    pub fn broadcast<UK: Key, UV: Data>(&mut self, state: &BroadcastState<UK, UV>) -> Broadcast<'_, UK, UV> {
        let store = crate::operator::broadcast::store(self.stores, self.owner, state, self.operator, self.error);
        Broadcast { store: store.map(|s| &*s), error: &mut *self.error, operator: self.operator }
    }

    /// The current key's value in `state`.
    pub fn value<T: Data>(&mut self, state: &ValueState<T>) -> Value<'_, K, T> {
        let (store, at) = self.slot(state.owner, state.index, state.ttl, "value state");
        Value { store, at }
    }

    /// The current key's list in `state`.
    pub fn list<T: Data>(&mut self, state: &ListState<T>) -> List<'_, K, T> {
        let (store, at) = self.slot(state.owner, state.index, state.ttl, "list state");
        List { store, at }
    }

    /// The current key's map in `state`.
    pub fn map<UK: Key, UV: Data>(&mut self, state: &MapState<UK, UV>) -> Map<'_, K, UK, UV> {
        let (store, at) = self.slot(state.owner, state.index, state.ttl, "map state");
        Map { store, at }
    }

    /// The current key's reduced value in `state`.
    pub fn reducing<T: Data>(&mut self, state: &ReducingState<T>) -> Reducing<'_, K, T> {
        let (store, at) = self.slot::<ReducingStore<K, T>, ReducingStore<K, T>>(
            state.owner,
            state.index,
            state.ttl,
            "reducing state",
        );
        // One store type with a time-to-live or without.
        let store = match store {
            Slot::Plain(s) | Slot::Expiring(s) => Some(s),
            Slot::Missing => None,
        };
        Reducing { store, at }
    }

    /// The current key's accumulator in `state`.
    pub fn aggregating<T: 'static, A: Aggregate<T>>(
        &mut self,
        state: &AggregatingState<T, A>,
    ) -> Aggregating<'_, K, T, A> {
        let (store, at) = self.slot::<AggregatingStore<K, T, A>, AggregatingStore<K, T, A>>(
            state.owner,
            state.index,
            state.ttl,
            "aggregating state",
        );
        let store = match store {
            Slot::Plain(s) | Slot::Expiring(s) => Some(s),
            Slot::Missing => None,
        };
        Aggregating { store, at }
    }
}

/// A keyed process function written as a type: Flink's
/// `KeyedProcessFunction`. Its states are declared when the job is wired
/// (the constructor passed to
/// [`KeyedStream::process_function`](crate::KeyedStream::process_function)
/// gets the [`States`] to declare them on and keeps the handles);
/// `process_element` runs per record and `on_timer` per timer that fires,
/// each with the key's context.
///
/// An error fails the record under the operator's policy (dead letter,
/// drop or stop); a failing `on_timer` has no record to dead-letter: under
/// `on_error::Fail` it stops the job, under the others it is counted as
/// dropped.
///
/// ```
/// use weibo::{KeyedProcessFunction, ProcessContext, States, Timer, ValueState, on_error};
///
/// /// Counts each key's records and reports the count 1 s (event time)
/// /// after its first one.
/// struct CountReport {
///     count: ValueState<u64>,
/// }
///
/// impl KeyedProcessFunction<char, char> for CountReport {
///     type Out = String;
///     type Error = String;
///
///     fn process_element(&self, ctx: &mut ProcessContext<'_, char, String>, _: &char) -> Result<(), String> {
///         let n = ctx.value(&self.count).get().unwrap_or(0);
///         if n == 0 {
///             ctx.register_timer(ctx.timestamp().unwrap_or(0) + 1_000);
///         }
///         ctx.value(&self.count).set(n + 1);
///         Ok(())
///     }
///
///     fn on_timer(&self, ctx: &mut ProcessContext<'_, char, String>, timer: Timer) -> Result<(), String> {
///         let n = ctx.value(&self.count).get().unwrap_or(0);
///         ctx.value(&self.count).clear();
///         let line = format!("{} at {}: {n}", ctx.key(), timer.time);
///         ctx.emit(line);
///         Ok(())
///     }
/// }
///
/// let out = weibo::testing::run_timed(vec![(100, 'a'), (150, 'a'), (5_000, 'b')], |s| {
///     s.key_by(|c: &char| *c).process_function(on_error::Fail, |states: &mut States<char>| CountReport {
///         count: states.value("count"),
///     })
/// })?;
/// assert_eq!(out, vec!["a at 1100: 2".to_string(), "b at 6000: 1".to_string()]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub trait KeyedProcessFunction<K, T>: Send + Sync + 'static {
    /// What it emits.
    type Out: Clone + Send + 'static;
    /// What it fails with (its text goes into dead letters and errors).
    type Error: Display;

    /// Handles one record of the current key.
    ///
    /// # Errors
    /// Whatever the function decides fails the record.
    fn process_element(&self, ctx: &mut ProcessContext<'_, K, Self::Out>, record: &T) -> Result<(), Self::Error>;

    /// Handles one of the current key's timers, when it fires. Does
    /// nothing unless implemented.
    ///
    /// # Errors
    /// Whatever the function decides.
    fn on_timer(&self, ctx: &mut ProcessContext<'_, K, Self::Out>, timer: Timer) -> Result<(), Self::Error> {
        let _ = (ctx, timer);
        Ok(())
    }
}

/// What a process closure may return: nothing (it cannot fail), or a
/// `Result` whose error fails the record under the operator's policy.
#[diagnostic::on_unimplemented(
    message = "a process function returns `()` or `Result<(), E>` with an error `E` that implements `Display`, not `{Self}`",
    label = "this closure returns `{Self}`",
    note = "end the closure with no value when it cannot fail, or return `Ok(())` / `Err(error)`; with only `Ok(())` in it, name the error type: `Ok::<(), String>(())`"
)]
pub trait ProcessOutcome {
    /// The failure, as text, if the call failed.
    #[doc(hidden)]
    fn failure(self) -> Option<String>;

    /// What a call that did nothing returns.
    #[doc(hidden)]
    fn nothing() -> Self;
}

impl ProcessOutcome for () {
    fn failure(self) -> Option<String> {
        None
    }

    fn nothing() -> Self {}
}

impl<E: Display> ProcessOutcome for std::result::Result<(), E> {
    fn failure(self) -> Option<String> {
        self.err().map(|e| e.to_string())
    }

    fn nothing() -> Self {
        Ok(())
    }
}

/// A process function given as closures (`process_with_state`): the
/// states declared, the function per record and the one per timer.
pub(crate) struct ClosureFunction<S, F, G, U, R> {
    states: S,
    f: F,
    on_timer: G,
    _types: Returns<U, R>,
}

/// What a [`ClosureFunction`]'s closures emit and return.
type Returns<U, R> = PhantomData<fn() -> (U, R)>;

impl<S, F, G, U, R> ClosureFunction<S, F, G, U, R> {
    pub(crate) fn new(states: S, f: F, on_timer: G) -> Self {
        Self { states, f, on_timer, _types: PhantomData }
    }
}

impl<K, T, U, S, F, G, R> KeyedProcessFunction<K, T> for ClosureFunction<S, F, G, U, R>
where
    K: 'static,
    T: 'static,
    U: Clone + Send + 'static,
    S: Send + Sync + 'static,
    F: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &T) -> R + Send + Sync + 'static,
    G: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, Timer) -> R + Send + Sync + 'static,
    R: ProcessOutcome + 'static,
{
    type Out = U;
    type Error = String;

    fn process_element(&self, ctx: &mut ProcessContext<'_, K, U>, record: &T) -> Result<(), String> {
        (self.f)(ctx, &self.states, record).failure().map_or(Ok(()), Err)
    }

    fn on_timer(&self, ctx: &mut ProcessContext<'_, K, U>, timer: Timer) -> Result<(), String> {
        (self.on_timer)(ctx, &self.states, timer).failure().map_or(Ok(()), Err)
    }
}

/// The factory of the operator that runs `function` with the states
/// `states` declared, under `policy`: outputs are the results and the dead
/// letters.
pub(crate) fn factory<K, T, F>(
    policy: Policy,
    function: Arc<F>,
    states: &States<K>,
    on_broadcast: Option<BroadcastFn<K, T, F::Out>>,
) -> Arc<dyn KeyedFactory>
where
    K: Key,
    T: Data,
    F: KeyedProcessFunction<K, T>,
{
    let declared: Arc<[Declared<K>]> = states.declared.iter().cloned().collect();
    let opener = states.outputs().opener();
    let owner = states.owner;
    keyed_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let (next, dead, sides) = open_process_outputs::<F::Out, T>(outs, policy, &opener, &info.name)?;
        let stores = declared
            .iter()
            .map(|d| (d.open)(ctx.state, &ctx.state_scope(&d.name), ctx.clock))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(FunctionOp::<K, T, F> {
            info,
            declared: declared.clone(),
            owner,
            stores,
            sides,
            timers: TimerState::open(ctx.state, &ctx.state_scope("timers"))?,
            processing: TimerState::open(ctx.state, &ctx.state_scope("processing_timers"))?,
            clock: ctx.clock.clone(),
            fired: ctx.clock.reporter(),
            sweep: Sweep { groups: ctx.key_groups.clone(), next: ctx.key_groups.start, at: Instant::now() },
            function: function.clone(),
            on_broadcast: on_broadcast.clone(),
            out: Batch::with_capacity(ctx.batch_size),
            next,
            failures: Failures::new(policy, dead)?,
            watermark: crate::record::NO_TIMESTAMP,
            key_buf: Vec::new(),
            records: Vec::with_capacity(ctx.batch_size),
        }))
    })
}

/// What an operator with a broadcast input runs for each of that input's
/// records (on every instance), with the broadcast states to write.
pub(crate) type BroadcastFn<K, T, U> =
    Arc<dyn for<'c> Fn(&mut BroadcastContext<'c, K, U>, &T) -> std::result::Result<(), String> + Send + Sync>;

/// The states with a time-to-live are swept a key group at a time, one
/// group every [`SWEEP_EVERY`]: a restored or idle job's expired entries
/// go away without a pass over the whole state on the record path.
struct Sweep {
    groups: std::ops::Range<u16>,
    next: u16,
    at: Instant,
}

/// How often one key group of each state with a time-to-live is swept.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// Runs a [`KeyedProcessFunction`] over its declared states and timers.
struct FunctionOp<K, T, F: KeyedProcessFunction<K, T>> {
    info: OpInfo,
    declared: Arc<[Declared<K>]>,
    owner: u32,
    stores: Vec<Box<dyn NamedStore<K>>>,
    /// The side outputs, by tag.
    sides: Sides,
    timers: TimerState<K>,
    processing: TimerState<K>,
    clock: Clock,
    /// Where a test harness's clock learns how far the timers have fired.
    fired: Option<Arc<AtomicI64>>,
    /// Which key group the states with a time-to-live are swept in next.
    sweep: Sweep,
    function: Arc<F>,
    /// The function of the broadcast input's records, if the operator has
    /// one.
    on_broadcast: Option<BroadcastFn<K, T, F::Out>>,
    out: Batch<F::Out>,
    next: Box<dyn Consumer<F::Out>>,
    failures: Failures<T>,
    /// The watermark up to which event-time timers have fired.
    watermark: Timestamp,
    key_buf: Vec<u8>,
    /// The batch's records, taken (see [`take_records`]).
    records: Vec<(K, T)>,
}

impl<K: Key, T: Data, F: KeyedProcessFunction<K, T>> FunctionOp<K, T, F> {
    /// Sends the results and side outputs gathered since the last call.
    fn emit_all(&mut self) -> Result<()> {
        emit(&self.info, &mut *self.next, &mut self.out)?;
        self.sides.emit(&self.info)
    }

    /// Fires every event-time timer at or below `wm`, in time order.
    fn advance(&mut self, wm: Timestamp) -> Result<()> {
        let now = self.clock.now();
        while let Some((time, keys)) = self.timers.pop_due(wm)? {
            for (key, group) in keys {
                self.fire(key, group, Timer { time, domain: TimeDomain::EventTime }, now, wm)?;
            }
        }
        self.watermark = self.watermark.max(wm);
        Ok(())
    }

    /// Fires every processing-time timer at or below the clock's time, in
    /// time order; the output goes out with the next emit. Returns the
    /// time it fired through.
    fn fire_processing(&mut self) -> Result<Timestamp> {
        let now = self.clock.now();
        while let Some((time, keys)) = self.processing.pop_due(now)? {
            for (key, group) in keys {
                self.fire(key, group, Timer { time, domain: TimeDomain::ProcessingTime }, now, self.watermark)?;
            }
        }
        Ok(now)
    }

    /// Calls `on_timer` for `key`'s `timer`, at processing time `now` and
    /// watermark `watermark` (what the function sees). An event-time
    /// timer's output carries its time as timestamp; a processing-time
    /// timer's carries none.
    fn fire(&mut self, key: K, group: u16, timer: Timer, now: Timestamp, watermark: Timestamp) -> Result<()> {
        self.key_buf.clear();
        key.encode_key(&mut self.key_buf);
        let timestamp = match timer.domain {
            TimeDomain::EventTime => timer.time,
            TimeDomain::ProcessingTime => crate::record::NO_TIMESTAMP,
        };
        let meta = Meta { timestamp, watermark: self.watermark, offset: 0, partition: 0, source: u32::MAX };
        let mut error = None;
        let mut ctx = ProcessContext {
            operator: &self.info.name,
            key: &key,
            key_bytes: &self.key_buf,
            group,
            owner: self.owner,
            stores: &mut self.stores,
            sides: &mut self.sides,
            timers: &mut self.timers,
            processing: &mut self.processing,
            now,
            error: &mut error,
            out: &mut self.out,
            meta,
            watermark,
        };
        let result = self.function.on_timer(&mut ctx, timer);
        if let Some(e) = error {
            return Err(e);
        }
        if let Err(message) = result {
            self.failures.fail_timer(&self.info, group, timer.time, &message)?;
        }
        Ok(())
    }
}

impl<K: Key, T: Data, F: KeyedProcessFunction<K, T>> FunctionOp<K, T, F> {
    /// A batch of the broadcast input: each record to the broadcast
    /// function, without a key.
    fn on_broadcast_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        let Some(f) = self.on_broadcast.clone() else {
            return Err(crate::error::internal_error!(
                "`{}` got a broadcast input's records but has no broadcast function",
                self.info.name
            ));
        };
        let mut values: Vec<T> = Vec::new();
        if !batch.take_typed(&mut values, &self.info.name).map_err(Error::Internal)? {
            values =
                batch.iter().map(|r| crate::operator::keyed::decode_value(&self.info, &r)).collect::<Result<_>>()?;
        }
        self.fire_processing()?;
        let now = self.clock.now();
        for (v, r) in values.into_iter().zip(batch.iter()) {
            if let Some(wm) = time.observe(&r.meta) {
                self.advance(wm)?;
            }
            let meta = Meta { watermark: self.watermark, ..r.meta };
            let mut error = None;
            let mut ctx = BroadcastContext {
                operator: &self.info.name,
                owner: self.owner,
                stores: &mut self.stores,
                sides: &mut self.sides,
                error: &mut error,
                out: &mut self.out,
                meta,
                now,
            };
            let result = f(&mut ctx, &v);
            if let Some(e) = error {
                return Err(e);
            }
            if let Err(message) = result {
                self.failures.fail(&self.info, v, r.meta, &message)?;
            }
        }
        self.emit_all()?;
        self.failures.push()
    }
}

impl<K: Key, T: Data, F: KeyedProcessFunction<K, T>> InputOperator for FunctionOp<K, T, F> {
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        if batch.is_broadcast() {
            return self.on_broadcast_batch(batch, time);
        }
        let mut records = std::mem::take(&mut self.records);
        take_records(&self.info, batch, &mut records)?;
        self.fire_processing()?;
        let now = self.clock.now();
        for ((key, v), r) in records.drain(..).zip(batch.iter()) {
            if let Some(wm) = time.observe(&r.meta) {
                self.advance(wm)?;
            }
            let meta = Meta { watermark: self.watermark, ..r.meta };
            let mut error = None;
            let mut ctx = ProcessContext {
                operator: &self.info.name,
                key: &key,
                key_bytes: r.key,
                group: r.group,
                owner: self.owner,
                stores: &mut self.stores,
                sides: &mut self.sides,
                timers: &mut self.timers,
                processing: &mut self.processing,
                now,
                error: &mut error,
                out: &mut self.out,
                meta,
                watermark: meta.watermark,
            };
            let result = self.function.process_element(&mut ctx, &v);
            if let Some(e) = error {
                return Err(e);
            }
            if let Err(message) = result {
                self.failures.fail(&self.info, v, r.meta, &message)?;
            }
        }
        // Its memory kept for the next batch.
        self.records = records;
        self.emit_all()?;
        self.failures.push()
    }

    fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.fire_processing()?;
        self.advance(wm)?;
        self.emit_all()?;
        self.next.watermark(wm)?;
        self.sides.watermark(wm)?;
        self.failures.watermark(wm)
    }

    fn flush(&mut self) -> Result<()> {
        // Called at least once a buffer timeout: processing-time timers
        // fire here when no records come.
        let now = self.fire_processing()?;
        if self.sweep.at.elapsed() >= SWEEP_EVERY && !self.sweep.groups.is_empty() {
            let group = self.sweep.next;
            for store in self.stores.iter_mut().filter(|s| s.expires()) {
                store.sweep(group, now, self.watermark)?;
            }
            self.sweep.next = if group + 1 >= self.sweep.groups.end { self.sweep.groups.start } else { group + 1 };
            self.sweep.at = Instant::now();
        }
        self.emit_all()?;
        self.failures.push()?;
        self.next.flush()?;
        self.sides.flush()?;
        self.failures.flush()?;
        // Once what they emitted has been flushed: a test harness that
        // moved its clock then finds it in its outputs.
        if let Some(fired) = &self.fired {
            fired.fetch_max(now, Ordering::AcqRel);
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.next.finish()?;
        self.sides.finish()?;
        self.failures.finish()
    }

    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.next.barrier(n)?;
        self.sides.barrier(n)?;
        self.failures.barrier(n)
    }

    fn state_stats(&self) -> Vec<(crate::state::StateName, StateStats)> {
        let mut stats: Vec<(crate::state::StateName, StateStats)> =
            self.declared.iter().zip(&self.stores).map(|(d, s)| (d.name.clone().into(), s.stats())).collect();
        stats.push(("timers".into(), self.timers.stats()));
        stats.push(("processing_timers".into(), self.processing.stats()));
        stats
    }

    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        let name = &self.info.name;
        let mut out = Vec::with_capacity(self.stores.len() + 1);
        let now = self.clock.now();
        for (d, store) in self.declared.iter().zip(&mut self.stores) {
            store.observe(now, self.watermark);
            out.push(snapshot_state(&mut **store, name, d.name.clone(), d.ty.clone(), at)?);
        }
        out.push(snapshot_state(&mut self.timers, name, "timers", StateType::internal(TIMERS), at)?);
        out.push(snapshot_state(&mut self.processing, name, "processing_timers", StateType::internal(TIMERS), at)?);
        Ok(out)
    }

    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        let name = &self.info.name;
        // A broadcast state's copies are in the key groups of the instances
        // that wrote them: every instance reads them all.
        let every_group = 0..u16::MAX;
        for (d, store) in self.declared.iter().zip(&mut self.stores) {
            let groups = if d.broadcast { &every_group } else { groups };
            restore_state(&mut **store, from, name, &d.name, &d.ty, groups)?;
        }
        restore_state(&mut self.timers, from, name, "timers", &StateType::internal(TIMERS), groups)?;
        restore_state(&mut self.processing, from, name, "processing_timers", &StateType::internal(TIMERS), groups)
    }
}
