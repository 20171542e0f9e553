//! Why a streaming observer aborted a decode: the first error it met, kept
//! typed for the engine (`EngineError::Streaming`).

use bmoe_flash::FlashError;
use bmoe_trace::route_trace::TraceError;

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("layer {layer}: router probabilities {what}")]
    RouterProbs { layer: u32, what: &'static str },
    #[error("{node}: cannot {what}")]
    NodeWrite { node: String, what: &'static str },
    #[error("expert read for layer {layer} failed: {source}")]
    ExpertRead { layer: u32, source: FlashError },
    #[error("expert down read for layer {layer:?} failed: {source}")]
    DownRead {
        layer: Option<u32>,
        source: FlashError,
    },
    #[error(
        "expert matmul {node} of layer {layer} ran without its routing being served (last \
         served layer {last:?}); stopping rather than computing with missing weights"
    )]
    Unserved {
        node: String,
        layer: u32,
        last: Option<u32>,
    },
    #[error("no arena region for {tensor}")]
    NoRegion { tensor: String },
    #[error("arena region for {tensor} is smaller than the tensor")]
    RegionTooSmall { tensor: String },
    #[error("{node} is not a readable I32 tensor")]
    Ids { node: String },
    #[error("{node}: expert id {id} out of range")]
    IdOutOfRange { node: String, id: i32 },
    #[error("writing the route trace: {0}")]
    RouteTrace(#[source] TraceError),
    #[error("--dense-weights anon: {0}")]
    DenseAnon(#[source] FlashError),
    #[error("{node}: not a routing node")]
    NotRouting { node: String },
    #[error("{node} routes {k} experts per token, the --route-from trace {trace_k}")]
    RouteWidth {
        node: String,
        k: i64,
        trace_k: usize,
    },
    #[error("--route-from: the trace routes no token at layer {layer}")]
    Untraced { layer: u32 },
}
