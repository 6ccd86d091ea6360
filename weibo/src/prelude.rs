//! What a pipeline needs, in one import:
//!
//! ```
//! use weibo::prelude::*;
//!
//! # weibo::testing::block_on(async {
//! let job = Job::new("doubled");
//! let out = CollectSink::new();
//! job.source(IterSource::new(vec![1u64, 2, 3])).map(|x: u64| x * 2).sink(out.clone());
//! job.run().await?;
//! let mut doubled = out.values();
//! doubled.sort_unstable();
//! assert_eq!(doubled, [2, 4, 6]);
//! # Ok::<(), weibo::Error>(())
//! # })?;
//! # Ok::<(), weibo::Error>(())
//! ```
//!
//! The job and its handles, the key derive, the built-in sources and sinks
//! that need no service, watermark strategies, window assigners and their
//! results, the keyed function's context and the failure policies. Writing
//! a source or sink of your own, tests (`weibo::testing`), state backends,
//! checkpoint storage and the admin API are imported from their modules.

// Not `Error` and `Result`: a glob import of them would shadow the
// standard library's `Result` in the importing module. They are
// `weibo::Error` and `weibo::Result`.
pub use weibo_macros::Key;

pub use crate::codec::Data;
pub use crate::codec::key::Key;
pub use crate::operator::connect::Either;
pub use crate::operator::function::{
    AggregatingState, KeyedProcessFunction, ListState, MapState, ProcessContext, ProcessOutcome, ReducingState, States,
    TimeDomain, Timer, ValueState,
};
pub use crate::operator::keyed::KeyedContext;
pub use crate::operator::outputs::{OutputContext, OutputTag, Outputs};
pub use crate::operator::windows::{Count, Session, Sliding, Tumbling, WindowResult};
pub use crate::runtime::status::JobState;
pub use crate::sinks::{Blackhole, CollectSink, FileSink, Stdout, TxnFileSink};
pub use crate::sources::{FileSource, Generator, IterSource};
pub use crate::state::StateTtl;
pub use crate::stream::job::{Job, JobHandle};
pub use crate::stream::{Aggregate, BatchOutput, DeadLetter, KeyedStream, Stream, on_error};
pub use crate::time::WatermarkStrategy;
