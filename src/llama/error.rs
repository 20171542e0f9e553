use std::path::PathBuf;

/// Errors raised by the llama.cpp seam.
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("model file {path} does not exist")]
    Missing { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not a gguf file (its first bytes are not the GGUF magic); pass a .gguf model"
    )]
    NotGguf { path: PathBuf },
    #[error(
        "{path} is truncated: its tensors need {needed_bytes} bytes but the file has {file_bytes}; \
         re-download or rebuild the model"
    )]
    Truncated {
        path: PathBuf,
        needed_bytes: u64,
        file_bytes: u64,
    },
    #[error("{path}: corrupt gguf header ({detail}); re-download or rebuild the model")]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "{path}: shard {no} of {count} of a split model is missing; put every \
         {prefix}-NNNNN-of-{count:05}.gguf file in one folder"
    )]
    ShardMissing {
        path: PathBuf,
        prefix: String,
        no: u32,
        count: u32,
    },
    #[error("{path}: {detail}; re-download the split model's shards or rebuild them")]
    ShardMismatch { path: PathBuf, detail: String },
    #[error(transparent)]
    Rpc(#[from] super::rpc::RpcError),
    #[error("llama.cpp failed to load the model {path} (run with -v to see llama.cpp's log)")]
    LoadFailed { path: PathBuf },
    #[error("llama.cpp failed to create a context: {0} (run with -v to see llama.cpp's log)")]
    ContextFailed(String),
    #[error("a batch of {tokens} tokens does not fit this context's n_batch {n_batch}")]
    BatchSize { tokens: usize, n_batch: u32 },
    #[error("llama_decode failed with code {0}")]
    Decode(i32),
    #[error(
        "two contexts of one model decoded at once (a bug in bmoe: decodes of a model take \
         turns, since their hooks rewrite the model's shared weight pointers)"
    )]
    ConcurrentDecode,
    #[error("the decode was aborted: its eval observer panicked: {0}")]
    ObserverPanicked(String),
    #[error("tokenization failed: {0}")]
    Tokenize(String),
    #[error("sampler: {0}")]
    Sampler(String),
    #[error(transparent)]
    Grammar(#[from] super::grammar::GrammarError),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("gguf: {0}")]
    Gguf(String),
    #[error("quantization: {0}")]
    Quant(String),
    #[error("MTP draft head: {0}")]
    Mtp(String),
    #[error(
        "the target context was lent to the MTP draft actor, which stopped without giving it back"
    )]
    TargetLent,
    #[error("sequence state: {0}")]
    SeqState(String),
    #[error("stopped by a signal")]
    Interrupted,
    #[error("path {0:?} contains a NUL byte")]
    NulInPath(PathBuf),
}
