//! The protobuf codec of every lksadmin RPC: prost's, with small buffers.
//!
//! tonic gives each stream an 8 KiB encode buffer and an 8 KiB decode
//! buffer, allocated when the stream opens and held while it lives. A
//! control server holds one `Connect` stream per node, idle but for a
//! heartbeat now and then, whose messages are a few hundred bytes: those
//! 16 KiB were the largest allocation per connected node we own (see
//! BENCHMARKS.md, "Server memory per agent"). Both buffers still grow on
//! demand to the largest message seen (`reserve` in tonic's encoder and
//! decoder), so large messages — blob chunks, desired states of many
//! bundles — cost what they did before; only the idle floor shrinks.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::ProstCodec;

/// Initial size of a stream's encode and decode buffer. A heartbeat, a
/// ping or a pong fits; the first larger message (a status report, a
/// desired state) grows the buffer to its size.
pub const STREAM_BUFFER_BYTES: usize = 256;

/// Encoded bytes gathered before a response stream yields to HTTP/2;
/// tonic's default.
pub const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

/// The buffer settings of [`LeanCodec`].
pub fn buffer_settings() -> BufferSettings {
    BufferSettings::new(STREAM_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}

/// [`ProstCodec`] with [`buffer_settings`]; the code generated from
/// `lks/v1/*.proto` uses it for every method (`codec_path` in build.rs).
#[derive(Debug, Clone, Copy)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(buffer_settings())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codec::{Decoder, Encoder};

    #[test]
    fn encoder_and_decoder_use_the_small_buffers() {
        // BufferSettings has no getters; its Debug output names the fields.
        let want = format!("{:?}", buffer_settings());
        assert!(want.contains("buffer_size: 256"), "{want}");
        let mut c = LeanCodec::<crate::pb::Ping, crate::pb::Ping>::default();
        assert_eq!(format!("{:?}", c.encoder().buffer_settings()), want);
        assert_eq!(format!("{:?}", c.decoder().buffer_settings()), want);
    }

    #[test]
    fn the_messages_of_an_idle_stream_fit_the_initial_buffer() {
        use crate::pb::{AgentMessage, ServerMessage, agent_message, server_message};
        use prost::Message;
        // Largest values: a stream up for centuries still fits.
        let idle = [
            AgentMessage {
                msg: Some(agent_message::Msg::Heartbeat(crate::pb::Heartbeat {
                    seq: u64::MAX,
                })),
            }
            .encoded_len(),
            AgentMessage {
                msg: Some(agent_message::Msg::Pong(crate::pb::Pong { nonce: u64::MAX })),
            }
            .encoded_len(),
            ServerMessage {
                msg: Some(server_message::Msg::Ping(crate::pb::Ping { nonce: u64::MAX })),
            }
            .encoded_len(),
        ];
        for len in idle {
            // gRPC frames each message with a 5-byte prefix.
            assert!(len + 5 <= STREAM_BUFFER_BYTES, "{len}");
        }
    }
}
