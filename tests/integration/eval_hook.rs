//! The eval-callback seam: an observer sees each layer's routing during a decode.

use std::sync::{Arc, Mutex};

use bmoe::generate;
use bmoe::llama::{Context, ContextParams, EvalObserver, Model, ModelParams, NodeView};

use crate::common::e8k2;

#[derive(Default)]
struct Routing {
    /// (layer, ids row-major [token][k], k)
    seen: Vec<(u32, Vec<i32>, usize)>,
}

struct TopkObserver(Arc<Mutex<Routing>>);

impl EvalObserver for TopkObserver {
    fn wants(&mut self, node: &NodeView<'_>) -> bool {
        node.name().starts_with("ffn_moe_topk-")
    }
    fn observe(&mut self, node: &NodeView<'_>) {
        let layer: u32 = node.name()["ffn_moe_topk-".len()..].parse().unwrap();
        let mut ids = Vec::new();
        assert!(node.copy_i32_2d(&mut ids), "topk is a host I32 tensor");
        let k = node.ne()[0] as usize;
        self.0.lock().unwrap().seen.push((layer, ids, k));
    }
}

#[test]
fn observer_sees_every_layers_routing_and_does_not_change_output() {
    let model = Arc::new(Model::load(e8k2(), &ModelParams::default()).unwrap());
    let tokens = generate::prompt_tokens(&model, "The quick brown fox", None).unwrap();
    let plain = {
        let mut ctx = Context::new(model.clone(), ContextParams::default()).unwrap();
        generate::generate(&mut ctx, &tokens, 12, 512, &mut |_: &str| {}).unwrap()
    };
    let routing = Arc::new(Mutex::new(Routing::default()));
    let observed = {
        let mut ctx = Context::new(
            model.clone(),
            ContextParams {
                observer: Some(Box::new(TopkObserver(routing.clone()))),
                ..Default::default()
            },
        )
        .unwrap();
        generate::generate(&mut ctx, &tokens, 12, 512, &mut |_: &str| {}).unwrap()
    };
    assert_eq!(
        plain.tokens, observed.tokens,
        "observing must not change the output"
    );
    let r = routing.lock().unwrap();
    // One prefill decode + 11 single-token decodes, 30 layers each.
    let decodes = 1 + observed.tokens.len() - 1;
    assert_eq!(r.seen.len(), 30 * decodes);
    let (layer0, prefill_ids, k) = &r.seen[0];
    assert_eq!((*layer0, *k), (0, 2));
    assert_eq!(
        prefill_ids.len(),
        tokens.len() * 2,
        "k ids per prompt token"
    );
    let layers: Vec<u32> = r.seen[..30].iter().map(|s| s.0).collect();
    assert_eq!(layers, (0..30).collect::<Vec<_>>());
    let mut used = [false; 8];
    for (_, ids, _) in r.seen.iter() {
        for pair in ids.chunks(2) {
            assert!(
                pair.iter().all(|&e| (0..8).contains(&e)),
                "ids in range: {pair:?}"
            );
            assert_ne!(pair[0], pair[1], "top-k ids are distinct");
            used[pair[0] as usize] = true;
        }
    }
    assert!(
        used.iter().filter(|&&u| u).count() >= 4,
        "routing varies across experts"
    );
}
