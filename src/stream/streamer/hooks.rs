//! The eval hooks built from a streamer: the verify context's, and the parts
//! of the MTP draft context's (assembled on the draft actor's thread).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bmoe_flash::cache::Requester;

use super::Streamer;
use crate::layout::MoeLayout;
use crate::stream::route_from::RouteCursor;
use crate::stream::{fault, hook::HookOptions, hook::SharedAnon, hook::StreamHook};

impl Streamer {
    /// The verify context's observer: its hook (see [`Self::verify_hook`]),
    /// under the injected observer fault when one is asked for.
    pub(crate) fn verify_observer(
        &self,
        abort: Arc<AtomicBool>,
        anon: Option<SharedAnon>,
        overlap: bool,
        force: Option<RouteCursor>,
    ) -> Box<dyn crate::llama::EvalObserver> {
        let hook = self.verify_hook(abort, anon, overlap, force);
        fault::PanicAt::wrap(Box::new(hook), self.observer_panic_at)
    }

    /// A hook for the verify context, demanding as the verify requester
    /// (with `--route-from`, the trace's routing forced on every row).
    fn verify_hook(
        &self,
        abort: Arc<AtomicBool>,
        anon: Option<SharedAnon>,
        overlap: bool,
        force: Option<RouteCursor>,
    ) -> StreamHook {
        let opts = HookOptions {
            k: self.k,
            overlap,
            counters: Some(self.flash.counters().clone()),
            predictor: self.predictor.clone(),
            drop_cold: self.drop_cold,
            route_log: false,
            anon,
            route_trace: self.route_trace.lock().ok().and_then(|mut w| w.take()),
            remote_from: self.layout.remote.as_ref().map(|r| r.first_block),
            fast_hits: self.predictor.is_none() && self.drop_cold == 0.0,
            force,
        };
        StreamHook::new(
            self.flash.client(Requester::Verify),
            self.flash.arena().clone(),
            &self.layout,
            opts,
            abort,
        )
    }

    /// What the MTP draft context's hook is built from, to be assembled on the
    /// draft actor's thread (a hook is not `Send`): the head's expert slices (its
    /// block is layer n_layer, routed at `ffn_moe_topk-{n_layer}`) are demanded
    /// from the same flash actor as the draft requester, with their own pins and
    /// byte counter (the flash split); without it they would be paged in
    /// silently through the file mapping. `anon` is the verify hook's store of
    /// dense copies (`--dense-weights anon`), shared so the head's own dense
    /// weights leave the mapping too. Serial: no overlap, prediction or drops;
    /// it logs its routing for the actor's pre-demand, made with a second
    /// client of the same requester.
    pub(crate) fn draft_hook_parts(&self, anon: Option<SharedAnon>) -> DraftHookParts {
        DraftHookParts {
            client: self.flash.client(Requester::Draft),
            predemand: self.flash.client(Requester::Draft),
            arena: self.flash.arena().clone(),
            layout: self.layout.clone(),
            k: self.k,
            anon,
        }
    }
}

/// The ingredients of the MTP draft context's hook, sent to the draft actor's
/// thread and assembled there ([`DraftHookParts::build`]).
pub(crate) struct DraftHookParts {
    client: bmoe_flash::FlashClient,
    /// The draft actor's own client (same requester, so its pins hand over to
    /// the hook's next demand): the pre-demand during the verify decode.
    predemand: bmoe_flash::FlashClient,
    arena: Arc<bmoe_flash::Arena>,
    layout: MoeLayout,
    k: u32,
    anon: Option<SharedAnon>,
}

impl DraftHookParts {
    /// The hook and the pre-demand client, on the thread that will run the context.
    pub(crate) fn build(self, abort: Arc<AtomicBool>) -> (StreamHook, bmoe_flash::FlashClient) {
        let opts = HookOptions {
            k: self.k,
            route_log: true,
            anon: self.anon,
            ..HookOptions::default()
        };
        let hook = StreamHook::new(self.client, self.arena, &self.layout, opts, abort);
        (hook, self.predemand)
    }
}
