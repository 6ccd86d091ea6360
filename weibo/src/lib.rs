#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! - [`stream`]: the typed DSL, [`Stream`], [`KeyedStream`], [`Job`] and
//!   [`JobHandle`]; [`window`]: event-time windows.
//! - [`time`]: watermark strategies; [`record`]: timestamps, source
//!   positions and checkpoint numbers.
//! - [`key`] and [`codec`]: how keys and values become bytes.
//! - [`sources`] and [`sinks`]: built-in connectors that need no service.
//! - [`state`]: keyed state backends; [`checkpoint`]: checkpoint storage
//!   and manifests.
//! - [`metrics`]: per-operator and per-edge counters; [`error`]: the one
//!   error type and who is to blame.
//! - [`testing`]: run a pipeline on in-memory input in one call.
//! - [`prelude`]: what a pipeline needs, in one `use weibo::prelude::*;`.
//!
//! How the crate is layered inside is in the book's design notes.

#[allow(unused_extern_crates)] // lets `#[derive(Key)]` name `::weibo` inside this crate
extern crate self as weibo;

pub mod checkpoint;
pub mod codec;
pub mod error;
mod graph;
pub mod metrics;
mod operator;
pub mod prelude;
pub mod record;
mod runtime;
pub mod sinks;
pub mod sources;
pub mod state;
pub mod stream;
mod task;
pub mod testing;
pub mod time;

/// Key types: how keys become bytes, and the key-group hash that routes them.
pub use codec::key;

pub mod window {
    //! Event-time windows: assigners, window functions, and the typed
    //! builder [`WindowedStream`].
    pub use crate::operator::windows::{
        Count, Elements, Session, Sliding, Spec, Tumbling, Window, WindowAssigner, WindowContext, WindowResult,
    };
    pub use crate::stream::window::{WindowedOutput, WindowedStream};
}

pub mod process {
    //! Keyed process functions with named state: the states a function
    //! declares ([`States`]), their handles, what a function sees per
    //! record or timer ([`ProcessContext`]) and the views of one key's
    //! state it reads and writes through ([`Value`], [`List`], [`Map`],
    //! [`Reducing`], [`Aggregating`]); typed side outputs ([`OutputTag`]),
    //! declared by a stateless `process` on [`Outputs`] and sent to
    //! through its [`OutputContext`]; broadcast state ([`BroadcastState`],
    //! written through a [`BroadcastContext`], read through [`Broadcast`])
    //! of an operator with a broadcast input ([`BroadcastConnectedStreams`]).
    pub use crate::operator::broadcast::{
        Broadcast, BroadcastContext, BroadcastMut, BroadcastReadContext, BroadcastState, BroadcastStates,
    };
    pub use crate::operator::connect::{Either, KeyedCoProcessFunction};
    pub use crate::operator::function::{
        Aggregating, AggregatingState, KeyedProcessFunction, List, ListState, Map, MapState, ProcessContext,
        ProcessOutcome, Reducing, ReducingState, States, TimeDomain, Timer, Value, ValueState,
    };
    pub use crate::operator::outputs::{OutputContext, OutputTag, Outputs};
    pub use crate::state::StateTtl;
    pub use crate::stream::broadcast::{BroadcastConnectedStreams, BroadcastStreams};
    pub use crate::stream::connect::{CoStreams, ConnectedStreams};
}

pub mod join {
    //! Joins of two keyed streams, inner and outer: the interval join
    //! ([`KeyedStream::interval_join`](crate::KeyedStream::interval_join)),
    //! the window join ([`KeyedStream::join`](crate::KeyedStream::join))
    //! the window co-group
    //! ([`KeyedStream::co_group`](crate::KeyedStream::co_group)), and a
    //! stream's joins with a table: temporal
    //! ([`KeyedStream::temporal_join`](crate::KeyedStream::temporal_join))
    //! and latest-value
    //! ([`KeyedStream::latest_join`](crate::KeyedStream::latest_join)).
    pub use crate::stream::join::{
        CoGroupWindows, CoGroupedStreams, IntervalJoinBetween, IntervalJoinBuilder, JoinWindows, JoinedStreams,
        LatestJoinBuilder, TemporalJoinBuilder,
    };
}

pub use codec::Data;
pub use codec::key::Key;
pub use error::{Error, Result};
pub use operator::async_io::AsyncOptions;
pub use operator::function::{
    AggregatingState, KeyedProcessFunction, ListState, MapState, ProcessContext, ProcessOutcome, ReducingState, States,
    TimeDomain, Timer, ValueState,
};
pub use operator::keyed::KeyedContext;
pub use runtime::status::JobState;
#[cfg(feature = "admin")]
pub use stream::admin::{AdminGroup, AdminOptions, AdminService};
pub use stream::job::{DEFAULT_MAX_KEY_GROUPS, Job, JobHandle, JobReport, MigratedState};
pub use stream::{Aggregate, BatchOutput, DeadLetter, KeyedStream, SinkRef, Stream, on_error};
pub use task::{BoxFuture, blocking};
pub use weibo_macros::{Key, RkyvData};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
