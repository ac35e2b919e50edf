//! The datagrams of an installed model ([`crate::Model::install`]): what a client sends and what
//! the kernel answers. Every field is a little-endian u32; the byte tables are in
//! docs/in-kernel.md ("The reply protocol") and `src/bpf/event.inc.c` builds the replies.
//!
//! A request is either text ([`text_request_datagram`]: UTF-8, tokenized in the kernel, optionally
//! wrapped in the chat template, with sampling parameters) or token ids made by a tokenizer in
//! user space, generated greedily (the event path's [`crate::request_datagram`]). A client sends it,
//! gets [`Reply::Accepted`] (or [`Reply::Refused`]), then sends [`poll_datagram`]s from the same
//! address and port with the offset of the text it has and the cookie ACCEPTED gave it: each is answered with the text since
//! that offset ([`Reply::Text`], at most [`TEXT_REPLY_MAX`] bytes and no more than the poll's
//! own length less 20, none while nothing new is generated), and once the generation is over and
//! every byte has been fetched, with [`Reply::Final`]. A reply is never longer than the poll it
//! answers: [`poll_datagram`] pads the poll for the largest reply.

use super::event::Refusal;

pub use super::event::{request_datagram, MAGIC as REQUEST_MAGIC};

/// The first word of a text request (`EV_TEXT_MAGIC`, "QBPT" in memory order).
pub const TEXT_MAGIC: u32 = 0x5450_4251;
/// The most text bytes one text request carries (`EV_TEXT_IN_MAX`). On a link with a 1,500-byte
/// MTU a datagram holds at most 1,424 (1,500 less the IPv4, UDP and request headers).
pub const TEXT_IN_MAX: usize = 4096;
/// Bytes of a text request's header, before its text: twelve words.
pub const TEXT_HEADER_BYTES: usize = 48;
/// A text request's flag: wrap the text in the chat template before tokenizing it
/// (`EV_TF_CHAT`; [`crate::Tokenizer::chat_prompt`]).
pub const FLAG_CHAT: u32 = 1;
/// 1.0 in a text request's sampling fields (Q16.16): the integer sampler's 1.0.
pub const ONE: u32 = crate::num::sample::ONE;

/// A text request's sampling fields, as the wire carries them: the integer sampler's parameters
/// (`src/bpf/sample.inc.c`, Q16.16 fixed point; 0 = off, and 1.0 is off too for top-p and the
/// penalty). `temperature` 0 is greedy. The kernel refuses values outside the sampler's limits
/// ([`crate::Refusal::Limit`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireSampling {
    /// Q16.16; 0: greedy, else 0.01 to 100.
    pub temperature: u32,
    /// Keep the `top_k` most likely tokens; 0: all.
    pub top_k: u32,
    /// Q16.16 in [0, 1]; 0: off.
    pub top_p: u32,
    /// Q16.16 in [0, 1]; 0: off.
    pub min_p: u32,
    /// Q16.16; 0 or 1.0: off, else 0.01 to 100.
    pub repetition_penalty: u32,
    /// The sampler's seed.
    pub seed: u64,
}

impl WireSampling {
    /// The wire form of `p`: the integer sampler's parameters, as [`crate::Model::generate`]
    /// uses them, so that one seed gives one text served and generated. Refuses what the
    /// sampler cannot take ([`crate::Error::InvalidParameter`]) and presence or frequency
    /// penalties, which the wire does not carry. Without a seed, one is drawn.
    pub fn from_params(p: &crate::SamplingParams) -> crate::Result<WireSampling> {
        let f = p.to_fixed()?;
        if f.presence_q16 != 0 || f.frequency_q16 != 0 {
            return Err(crate::Error::InvalidParameter {
                name: "presence_penalty",
                value: (p.presence_penalty + p.frequency_penalty) as f64,
                expected: "0: the wire carries no presence or frequency penalty",
            });
        }
        Ok(WireSampling {
            temperature: f.temp_q16,
            top_k: f.top_k,
            top_p: f.top_p_q16,
            min_p: f.min_p_q16,
            repetition_penalty: f.rep_q16,
            // no seed: one drawn as the library's sampler draws one
            seed: p
                .seed
                .unwrap_or_else(crate::run::sampling::random_seed),
        })
    }
}

/// A text request: `text` (at most [`TEXT_IN_MAX`] bytes of UTF-8), tokenized by the kernel,
/// wrapped in the chat template when `chat`, and generated with `sampling`
/// ([`WireSampling::default`]: greedy). The 48-byte header is twelve little-endian words:
/// [`TEXT_MAGIC`], `request`, `max_new`, flags ([`FLAG_CHAT`]), temperature, top_k, top_p,
/// min_p, repetition penalty, the seed's low and high words, the text's length; then the text.
pub fn text_request_datagram(
    request: u32,
    max_new: u32,
    text: &str,
    chat: bool,
    sampling: &WireSampling,
) -> Vec<u8> {
    let w = sampling;
    let mut d: Vec<u8> = [
        TEXT_MAGIC,
        request,
        max_new,
        if chat { FLAG_CHAT } else { 0 },
        w.temperature,
        w.top_k,
        w.top_p,
        w.min_p,
        w.repetition_penalty,
        w.seed as u32,
        (w.seed >> 32) as u32,
        text.len() as u32,
    ]
    .iter()
    .flat_map(|w| w.to_le_bytes())
    .collect();
    d.extend_from_slice(text.as_bytes());
    d
}

/// The first word of a poll datagram (`EV_POLL_MAGIC`, "QBPL" in memory order).
pub const POLL_MAGIC: u32 = 0x4C50_4251;
/// The first word of every reply (`EV_REPLY_MAGIC`, "QBPR").
pub const REPLY_MAGIC: u32 = 0x5250_4251;
/// Reply kinds (the second word).
pub const KIND_ACCEPTED: u32 = 1;
/// See [`KIND_ACCEPTED`].
pub const KIND_REFUSED: u32 = 2;
/// See [`KIND_ACCEPTED`].
pub const KIND_TEXT: u32 = 3;
/// See [`KIND_ACCEPTED`].
pub const KIND_FINAL: u32 = 4;
/// The most text bytes one [`Reply::Text`] carries (`EV_TEXT_REPLY_MAX`).
pub const TEXT_REPLY_MAX: usize = 1024;
/// Bytes of a poll datagram: its three words and the padding that makes room for the largest
/// reply (a reply is never longer than the poll it answers: 20 header bytes and
/// [`TEXT_REPLY_MAX`] text bytes).
pub const POLL_BYTES: usize = 20 + TEXT_REPLY_MAX;
/// The shortest poll the kernel answers (room for the final record); it carries at most
/// `length - 20` text bytes.
pub const POLL_MIN_BYTES: usize = 32;

/// Why a generation ended, as the [`Reply::Final`] record says (`EV_FIN_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finish {
    /// A stop token was generated (code 1; the token id; its text is not in the text).
    Stop(u32),
    /// The request's `max_new` tokens were generated (code 2).
    MaxTokens,
    /// The context is full (code 3).
    ContextFull,
    /// The slot's text buffer is full (code 4): the last token's text did not fit.
    Length,
    /// The kernel failed the generation (code 5; its error code).
    Error(i32),
    /// A text request's text did not become a prompt (code 6): its tokens did not fit the
    /// prompt limit or the context (the detail: the tokens it needed, or a negative tokenizer
    /// error code).
    Prompt(i32),
}

impl Finish {
    /// From the FINAL record's finish code and detail word.
    pub fn from_code(code: u32, detail: u32) -> Option<Finish> {
        Some(match code {
            1 => Finish::Stop(detail),
            2 => Finish::MaxTokens,
            3 => Finish::ContextFull,
            4 => Finish::Length,
            5 => Finish::Error(detail as i32),
            6 => Finish::Prompt(detail as i32),
            _ => return None,
        })
    }

    /// A short name: `stop`, `max-tokens`, `context-full`, `length`, `error`, `prompt`.
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop(_) => "stop",
            Finish::MaxTokens => "max-tokens",
            Finish::ContextFull => "context-full",
            Finish::Length => "length",
            Finish::Error(_) => "error",
            Finish::Prompt(_) => "prompt",
        }
    }
}

/// One reply datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// The request was accepted and is being generated (or was accepted before: a request sent
    /// again is not started again).
    Accepted {
        /// The request id.
        request: u32,
        /// The server cookie: every poll for this request carries it ([`poll_datagram`]); a
        /// poll without it gets no reply. Bound to the client's address and port, the id and
        /// the server's slot, keyed by a secret of the installation: unguessable by a sender
        /// that did not receive this reply.
        cookie: u64,
    },
    /// The request or poll was refused.
    Refused {
        /// The request id (0 when the datagram was too short to carry one).
        request: u32,
        /// Why; `None` for a code this build does not know.
        reason: Option<Refusal>,
        /// The raw reason code.
        code: u32,
    },
    /// Text bytes of the request from `offset` (possibly none: nothing new yet).
    Text {
        /// The request id.
        request: u32,
        /// Where the bytes start in the request's text.
        offset: u32,
        /// The bytes (possibly part of a UTF-8 character at either end).
        bytes: Vec<u8>,
    },
    /// The generation is over and `text_len` bytes is all its text.
    Final {
        /// The request id.
        request: u32,
        /// The whole text's length in bytes.
        text_len: u32,
        /// Why it ended; `None` for a code this build does not know.
        finish: Option<Finish>,
        /// Prompt tokens.
        prompt_tokens: u32,
        /// Tokens the model generated, including a stop token or one whose text did not fit.
        generated_tokens: u32,
    },
}

/// A poll for request `request`'s text from byte `offset`, with the `cookie` of its
/// [`Reply::Accepted`]: five words, zero-padded to [`POLL_BYTES`] so that the reply can carry up
/// to [`TEXT_REPLY_MAX`] bytes.
pub fn poll_datagram(request: u32, offset: u32, cookie: u64) -> Vec<u8> {
    let mut d: Vec<u8> = [POLL_MAGIC, request, offset, cookie as u32, (cookie >> 32) as u32]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    d.resize(POLL_BYTES, 0);
    d
}

impl Reply {
    /// Parses a reply; `None` for a datagram that is not one.
    pub fn parse(d: &[u8]) -> Option<Reply> {
        let w = |i: usize| -> Option<u32> {
            Some(u32::from_le_bytes(
                d.get(4 * i..4 * i + 4)?.try_into().ok()?,
            ))
        };
        if w(0)? != REPLY_MAGIC {
            return None;
        }
        let request = w(2)?;
        Some(match w(1)? {
            KIND_ACCEPTED => Reply::Accepted {
                request,
                cookie: u64::from(w(4)?) << 32 | u64::from(w(3)?),
            },
            KIND_REFUSED => Reply::Refused {
                request,
                reason: Refusal::from_code(w(3)?),
                code: w(3)?,
            },
            KIND_TEXT => {
                let n = w(4)? as usize;
                if n > TEXT_REPLY_MAX {
                    return None;
                }
                Reply::Text {
                    request,
                    offset: w(3)?,
                    bytes: d.get(20..20 + n)?.to_vec(),
                }
            }
            KIND_FINAL => Reply::Final {
                request,
                text_len: w(3)?,
                finish: Finish::from_code(w(4)?, w(7)?),
                prompt_tokens: w(5)?,
                generated_tokens: w(6)?,
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_from_their_byte_layout() {
        let words = |w: &[u32]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        let mut text = words(&[REPLY_MAGIC, KIND_TEXT, 7, 3, 2]);
        text.extend_from_slice(b"hi");
        assert_eq!(
            Reply::parse(&text),
            Some(Reply::Text {
                request: 7,
                offset: 3,
                bytes: b"hi".to_vec()
            })
        );
        assert_eq!(
            Reply::parse(&words(&[REPLY_MAGIC, KIND_FINAL, 7, 5, 1, 4, 9, 151_645])),
            Some(Reply::Final {
                request: 7,
                text_len: 5,
                finish: Some(Finish::Stop(151_645)),
                prompt_tokens: 4,
                generated_tokens: 9
            })
        );
        assert_eq!(
            Reply::parse(&words(&[REPLY_MAGIC, KIND_REFUSED, 7, 5, 0])),
            Some(Reply::Refused {
                request: 7,
                reason: Some(Refusal::UnknownRequest),
                code: 5
            })
        );
        assert_eq!(Reply::parse(&words(&[REQUEST_MAGIC, 1, 2, 3, 4])), None);
        assert_eq!(
            Reply::parse(&words(&[REPLY_MAGIC, KIND_ACCEPTED, 7, 0x89ab_cdef, 0x0123_4567])),
            Some(Reply::Accepted {
                request: 7,
                cookie: 0x0123_4567_89ab_cdef
            })
        );
        let poll = poll_datagram(7, 3, 0x0123_4567_89ab_cdef);
        assert_eq!(poll.len(), POLL_BYTES);
        assert_eq!(poll[..20], words(&[POLL_MAGIC, 7, 3, 0x89ab_cdef, 0x0123_4567]));
        assert!(poll[20..].iter().all(|&b| b == 0));
    }
}
