//! Test-only fault for the verify context's eval observer
//! (`--inject-faults observer_panic_at=N`): a panic at its Nth observed node,
//! standing for a bug in the hook. The decode must abort and the run fail with
//! the panic's message, never finish on weights the hook did not prepare.

use bmoe_decode::metrics::DecodeMetrics;

use crate::llama::{BatchShape, EvalObserver, NodeView};

pub(crate) struct PanicAt {
    inner: Box<dyn EvalObserver>,
    at: u64,
    seen: u64,
}

impl PanicAt {
    /// `inner` as it is when `at` is 0, else panicking at its `at`-th observed node.
    pub(crate) fn wrap(inner: Box<dyn EvalObserver>, at: u64) -> Box<dyn EvalObserver> {
        if at == 0 {
            return inner;
        }
        Box::new(Self { inner, at, seen: 0 })
    }
}

impl EvalObserver for PanicAt {
    fn wants(&mut self, node: &NodeView<'_>) -> bool {
        self.inner.wants(node)
    }

    fn observe(&mut self, node: &NodeView<'_>) {
        self.seen += 1;
        if self.seen == self.at {
            panic!(
                "injected panic in the eval observer at node {} (observed node {})",
                node.name(),
                self.at
            );
        }
        self.inner.observe(node);
    }

    fn decode_begin(&mut self, batch: BatchShape) {
        self.inner.decode_begin(batch);
    }

    fn decode_end(&mut self) {
        self.inner.decode_end();
    }

    fn take_metrics(&mut self) -> DecodeMetrics {
        self.inner.take_metrics()
    }

    fn failure(&self) -> Option<crate::llama::ObserverFailure> {
        self.inner.failure()
    }
}
