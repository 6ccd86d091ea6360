//! Two inputs: the record a connected stream's operator reads
//! ([`Either`]: from one input or the other), and the keyed function of
//! two inputs ([`KeyedCoProcessFunction`]), run as a keyed process
//! function over it.
//!
//! A connected stream is the union of its two inputs, each record wrapped
//! in the side it came from, keyed by each side's key function: the
//! operator's input channels come from both sides, so barriers align
//! across both (as for any union), its watermark is the minimum of both
//! sides' (an idle or ended side holds nothing back), and it ends when
//! both have.

use std::fmt::Display;
use std::sync::Arc;

use crate::codec::schema::{Schema, Shape};
use crate::codec::{CodecError, CodecId, Data};
use crate::operator::function::{KeyedProcessFunction, ProcessContext, Timer};

/// A record of one of a connected stream's two inputs: the first input
/// (the stream `connect` was called on) is `Left`, the second `Right`. A
/// two-input operator's dead letters are of this type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Either<A, B> {
    /// A record of the first input.
    Left(A),
    /// A record of the second input.
    Right(B),
}

impl<A: Data, B: Data> Data for Either<A, B> {
    fn codec_id() -> CodecId {
        CodecId::new("weibo-either/1", std::any::type_name::<Self>())
    }

    /// A tag byte (0: left, 1: right), then the side's own encoding.
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        match self {
            Self::Left(a) => {
                out.push(0);
                a.encode(out)
            }
            Self::Right(b) => {
                out.push(1);
                b.encode(out)
            }
        }
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        match bytes.split_first() {
            Some((0, rest)) => Ok(Self::Left(A::decode(rest)?)),
            Some((1, rest)) => Ok(Self::Right(B::decode(rest)?)),
            Some((tag, _)) => Err(CodecError {
                codec: Self::codec_id(),
                reason: format!("side tag {tag}, not 0 (left) or 1 (right)"),
            }),
            None => Err(CodecError { codec: Self::codec_id(), reason: "no bytes, not even a side tag".into() }),
        }
    }

    fn schema() -> Arc<Schema> {
        let side = |name: &str, shape: Shape| (name.to_string(), vec![(String::new(), shape)]);
        Arc::new(Schema {
            shape: Shape::Enum {
                name: "Either".into(),
                variants: vec![side("Left", A::schema().shape.clone()), side("Right", B::schema().shape.clone())],
            },
        })
    }

    fn check_round_trip() -> Result<(), String> {
        A::check_round_trip()?;
        B::check_round_trip()
    }
}

/// A keyed function of two inputs (Flink's `KeyedCoProcessFunction`):
/// `process_element1` runs per record of the first input,
/// `process_element2` per record of the second, both with the same key's
/// states and timers, and `on_timer` per timer either set.
///
/// Run it with `ConnectedStreams::process_function`, which gives its
/// constructor the [`States`](crate::process::States) to declare on.
pub trait KeyedCoProcessFunction<K, A, B>: Send + Sync + 'static {
    /// What it emits.
    type Out: Clone + Send + 'static;
    /// What it fails with (its text goes into dead letters and errors).
    type Error: Display;

    /// Handles one record of the first input, of the current key.
    ///
    /// # Errors
    /// Whatever the function decides fails the record.
    fn process_element1(&self, ctx: &mut ProcessContext<'_, K, Self::Out>, record: &A) -> Result<(), Self::Error>;

    /// Handles one record of the second input, of the current key.
    ///
    /// # Errors
    /// Whatever the function decides fails the record.
    fn process_element2(&self, ctx: &mut ProcessContext<'_, K, Self::Out>, record: &B) -> Result<(), Self::Error>;

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

/// Runs a [`KeyedCoProcessFunction`] as a process function over
/// [`Either`].
pub(crate) struct CoProcess<F>(pub(crate) F);

impl<K, A, B, F> KeyedProcessFunction<K, Either<A, B>> for CoProcess<F>
where
    F: KeyedCoProcessFunction<K, A, B>,
{
    type Out = F::Out;
    type Error = F::Error;

    fn process_element(
        &self,
        ctx: &mut ProcessContext<'_, K, Self::Out>,
        record: &Either<A, B>,
    ) -> Result<(), Self::Error> {
        match record {
            Either::Left(a) => self.0.process_element1(ctx, a),
            Either::Right(b) => self.0.process_element2(ctx, b),
        }
    }

    fn on_timer(&self, ctx: &mut ProcessContext<'_, K, Self::Out>, timer: Timer) -> Result<(), Self::Error> {
        self.0.on_timer(ctx, timer)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn either_encodes_its_side_and_refuses_a_foreign_tag() {
        for value in [Either::<u32, String>::Left(7), Either::Right("seven".into())] {
            let mut bytes = Vec::new();
            value.encode(&mut bytes).unwrap();
            assert_eq!(Either::<u32, String>::decode(&bytes).unwrap(), value);
        }
        let err = Either::<u32, String>::decode(&[2, 0]).unwrap_err();
        assert!(err.reason.contains("side tag 2"), "{err:?}");
        assert!(Either::<u32, String>::decode(&[]).is_err());
    }
}
