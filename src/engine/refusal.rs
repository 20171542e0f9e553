//! Why the engine refuses a configuration: each is bad input that other
//! arguments fix (the command exits with the usage code).

use std::path::PathBuf;

use super::ctx_check::CtxRefusal;
use super::state_error::StateReadError;
use crate::stream::route_from::RouteFromError;

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "--n-expert-used {k}: this model has {n_expert} experts per layer (routes {default_k} \
         by default); choose 1..={n_expert}"
    )]
    ExpertsUsed {
        k: u32,
        n_expert: u32,
        default_k: u32,
    },
    #[error(
        "--n-expert-used {k}: {arch} routes its first {hash_layers} layer(s) by token id \
         through a table of {default_k} experts per token (ffn_gate_tid2eid): drop \
         --n-expert-used"
    )]
    HashRouted {
        k: u32,
        arch: String,
        hash_layers: u32,
        default_k: u32,
    },
    #[error(
        "--mtp needs a model with an MTP (nextn) head; {} has none (nextn_predict_layers is \
         0): use --ngram for drafts without a head",
        .model.display()
    )]
    NoMtpHead { model: PathBuf },
    #[error("--mtp-p-min {p_min}: give a probability in 0..=1")]
    MtpPMin { p_min: f32 },
    #[error(
        "--rpc with --mtp: the MTP head's layer would sit on an RPC host, which bmoe does not \
         support; drop one of them"
    )]
    RpcWithMtp,
    #[error("--rpc-layers {n}: {} has {blocks} layers (blocks); choose 0..={blocks}", .model.display())]
    RpcLayers { n: u32, model: PathBuf, blocks: u32 },
    #[error(
        "--rpc-layers {blocks}: those layers and the output layer take {need_mib} MiB but the \
         RPC hosts report {free_mib} MiB free; give fewer layers, more hosts, or --rpc-layers \
         auto"
    )]
    RpcTooSmall {
        blocks: u32,
        need_mib: u64,
        free_mib: u64,
    },
    #[error(
        "--route-trace {} with --rpc-layers {remote_blocks}: every layer with experts would \
         be on the RPC hosts, so nothing streams here and there is nothing to record; give \
         --rpc-layers fewer than {remote_blocks} (at most {most} keeps one here), or drop \
         --route-trace",
        .trace.display()
    )]
    RouteTraceAllRemote {
        trace: PathBuf,
        remote_blocks: u32,
        most: u32,
    },
    #[error(transparent)]
    RouteFrom(#[from] RouteFromError),
    #[error(transparent)]
    Context(#[from] CtxRefusal),
    #[error(transparent)]
    State(#[from] StateReadError),
}
