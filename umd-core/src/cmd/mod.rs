//! Commands: what the user asks for ([`Command`]), how one generation turns
//! it into packets ([`Encoder`]), and where the packets go
//! ([`CommandBuffer`], chunked and chained).

mod buffer;
mod command;
mod encode;

pub use buffer::{split_region, Chunk, ChunkSource, CommandBuffer, Finished, SliceChunks};
pub use command::{Command, CompareOp, DispatchOp, FieldValues, OperandError, Payload, PayloadIter};
pub use encode::{CommandSpan, EncodeError, Encoder};

/// [`CommandSpan`] under its former name (the VA allocator has a placement
/// too, [`crate::mem::VaPlacement`]).
#[deprecated(note = "renamed to `CommandSpan`")]
pub type Placement = CommandSpan;
