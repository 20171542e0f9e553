//! What the engine tells a user about how a run was set up or ended: typed
//! where it is decided, rendered once here (the summary's `note:` lines,
//! `serve`'s and `chat`'s start-up lines).

use std::fmt;
use std::path::PathBuf;

use crate::layout::RemoteShare;
use crate::stream::{AutoTerms, StreamNote};

/// One fact for the summary.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// A model without expert tensors, given no streaming flag.
    DenseResident,
    /// `--spec auto` on a model without an MTP head.
    NgramOnly { model: PathBuf },
    /// `--rpc` took every layer: nothing streams on this host.
    AllLayersRemote,
    /// How `--rpc` split the layers.
    RpcSplit(RpcSplit),
    /// llama.cpp rounded `-c` up.
    ContextRounded { n_ctx: u32, asked: u32 },
    /// How `--cache-mb auto` was resolved.
    CacheAuto(AutoTerms),
    /// From the streamer (its reader's fallbacks, `--cache-warm`).
    Stream(StreamNote),
    /// `--inject-fault`'s counts at the end of the run.
    InjectedFaults { summary: String },
    /// `--route-trace` written, and how to use it.
    RouteTrace { path: PathBuf },
    /// The model carries no chat template.
    NoChatTemplate { model: PathBuf },
    /// `--route-from`: the routing forced from a trace of `tokens` tokens
    /// (`predicted`: with `--predict-prefetch`).
    RouteFrom {
        path: PathBuf,
        tokens: usize,
        predicted: bool,
    },
}

/// What `--rpc` put where, for [`Note::RpcSplit`].
#[derive(Debug, Clone, PartialEq)]
pub struct RpcSplit {
    pub share: RemoteShare,
    pub endpoints: Vec<String>,
    pub free_bytes: u64,
    pub blocks: u32,
}

const MIB: u64 = 1024 * 1024;

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DenseResident => {
                f.write_str("dense model (no expert tensors): running resident, nothing to stream")
            }
            Self::NgramOnly { model } => write!(
                f,
                "--spec auto: {} has no MTP head, so every draft comes from the n-gram matcher",
                model.display()
            ),
            Self::AllLayersRemote => {
                f.write_str("rpc: every layer is on the RPC hosts: nothing streams here")
            }
            Self::RpcSplit(s) => s.fmt(f),
            Self::ContextRounded { n_ctx, asked } => write!(
                f,
                "context: {n_ctx} tokens (-c {asked} rounded up by llama.cpp to a multiple of 256)"
            ),
            Self::CacheAuto(terms) => f.write_str(&terms.line()),
            Self::Stream(n) => n.fmt(f),
            Self::InjectedFaults { summary } => f.write_str(summary),
            Self::RouteTrace { path } => write!(
                f,
                "route trace: {p} (size the cache from it: bmoe replay {p} --cache-mb 10%,25%,50%)",
                p = path.display()
            ),
            Self::RouteFrom {
                path,
                tokens,
                predicted,
            } => {
                write!(
                    f,
                    "--route-from {}: every row routed as the trace's {tokens} tokens (in order, \
                     wrapping), so the text is meaningless by design: the reads, stalls, cache \
                     and compute are those of the trace's routing",
                    path.display()
                )?;
                if *predicted {
                    f.write_str(
                        "; --predict-prefetch guessed from hidden states that did not choose \
                         these experts (compare a run without it)",
                    )?;
                }
                Ok(())
            }
            Self::NoChatTemplate { model } => write!(
                f,
                "{} carries no chat template (tokenizer.chat_template): chats are rendered with \
                 llama.cpp's built-in chatml (give one with --chat-template-file)",
                model.display()
            ),
        }
    }
}

impl fmt::Display for RpcSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.share;
        write!(
            f,
            "rpc: {} on {} ({} MiB there, {} MiB reported free); {} of {} layers stream here \
             ({:.1} MiB routed per token)",
            s.held_layers(),
            self.endpoints.join(","),
            s.remote_bytes / MIB,
            self.free_bytes / MIB,
            s.first_block,
            self.blocks,
            s.local_routed_bytes_per_token as f64 / MIB as f64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_note_renders_its_facts() {
        let rounded = Note::ContextRounded {
            n_ctx: 512,
            asked: 300,
        };
        assert_eq!(
            rounded.to_string(),
            "context: 512 tokens (-c 300 rounded up by llama.cpp to a multiple of 256)"
        );
        let trace = Note::RouteTrace {
            path: "t.bin".into(),
        };
        assert!(trace.to_string().contains("bmoe replay t.bin --cache-mb"));
        let forced = Note::RouteFrom {
            path: "a.trace".into(),
            tokens: 30,
            predicted: true,
        };
        let forced = forced.to_string();
        assert!(forced.contains("meaningless by design"), "{forced}");
        assert!(forced.contains("did not choose these experts"), "{forced}");
        let model = PathBuf::from("m.gguf");
        assert!(Note::NgramOnly { model }
            .to_string()
            .starts_with("--spec auto: m.gguf"));
    }
}
