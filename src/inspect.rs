//! `bmoe inspect`: what a gguf holds, from its header alone (nothing is loaded).

use std::fmt::Write;

use crate::layout::{MoeLayout, Proj};

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

/// A human-readable description of the model's layout.
pub fn report(path: &std::path::Path, l: &MoeLayout) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "model:            {}", path.display());
    let _ = writeln!(s, "arch:             {}", l.arch);
    let _ = writeln!(
        s,
        "file bytes:       {} ({})",
        l.file_bytes,
        mib(l.file_bytes)
    );
    let _ = writeln!(s, "alignment:        {}", l.alignment);
    if l.is_split() {
        shard_lines(&mut s, l);
    }
    let _ = writeln!(
        s,
        "layers:           {} trunk + {} nextn (MTP)",
        l.n_layer, l.n_layer_nextn
    );
    let _ = writeln!(s, "n_expert:         {}", l.n_expert);
    let _ = writeln!(s, "n_expert_used:    {}", l.n_expert_used);
    if l.is_moe() {
        expert_lines(&mut s, l);
    } else {
        let _ = writeln!(
            s,
            "experts:          none (dense model: runs resident, nothing to stream)"
        );
    }
    let _ = writeln!(
        s,
        "dense bytes:      {} ({})",
        l.dense_bytes(),
        mib(l.dense_bytes())
    );
    let _ = writeln!(
        s,
        "expert bytes:     {} ({})",
        l.expert_bytes(),
        mib(l.expert_bytes())
    );
    let _ = writeln!(
        s,
        "routed bytes/tok: {} ({})",
        l.routed_bytes_per_token(),
        mib(l.routed_bytes_per_token())
    );
    if l.n_layer_nextn > 0 {
        let _ = writeln!(
            s,
            "routed bytes/MTP: {} ({})",
            l.routed_bytes_per_mtp_pass(),
            mib(l.routed_bytes_per_mtp_pass())
        );
    }
    let types: Vec<String> = l
        .tally
        .types
        .iter()
        .map(|(t, (n, b))| format!("{t} x{n} ({})", mib(*b)))
        .collect();
    let _ = writeln!(s, "quant types:      {}", types.join(", "));
    let _ = writeln!(s, "verdict:          {}", verdict(l));
    s
}

/// One line per projection's expert slice, and the expert layers.
fn expert_lines(s: &mut String, l: &MoeLayout) {
    for p in Proj::ALL {
        if let Some(b) = l.slice_bytes(p) {
            let ty = l
                .experts
                .iter()
                .find(|e| e.proj == p)
                .map(|e| e.ggml_type.name())
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "expert slice {:<5} {} bytes ({ty})",
                format!("{}:", p.name()),
                b
            );
        }
    }
    let _ = writeln!(s, "expert layers:    {}", l.expert_layers().len());
}

/// One line per shard of a split model: its file, bytes, tensors and expert bytes.
fn shard_lines(s: &mut String, l: &MoeLayout) {
    let _ = writeln!(s, "shards:           {}", l.shards.len());
    for (i, sh) in l.shards.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {}: {} tensors, {}, experts {}",
            sh.path.display(),
            sh.tensors,
            mib(sh.file_bytes),
            mib(l.shard_expert_bytes(i))
        );
    }
}

/// Whether bmoe can stream the model, and where its routed bytes come from;
/// or why not.
pub(crate) fn verdict(l: &MoeLayout) -> String {
    if l.n_expert == 0 && l.experts.is_empty() {
        return "not streamable: a dense model (no experts); it runs resident".into();
    }
    if l.experts.is_empty() {
        let seen = if l.unknown_experts.is_empty() {
            "none named *exps.weight".to_string()
        } else {
            l.unknown_experts.join(", ")
        };
        return format!(
            "not streamable: expert_count is {} but no blk.N.ffn_{{gate,up,gate_up,down}}_exps.weight \
             tensors (expert tensors seen: {seen}); run it with --resident",
            l.n_expert
        );
    }
    let layers = l.expert_layers();
    let fused = l.fused_layers();
    let projs = if fused.len() == layers.len() {
        "gate+up fused in one slice, down".to_string()
    } else if fused.is_empty() {
        let names: Vec<&str> = Proj::ALL
            .iter()
            .filter(|p| l.slice_bytes(**p).is_some())
            .map(|p| p.name())
            .collect();
        names.join(", ")
    } else {
        format!(
            "gate+up fused on {} of {} layers",
            fused.len(),
            layers.len()
        )
    };
    let mut v = format!(
        "streamable: {} of {} experts routed per token on {} MoE layers ({projs}); {} routed per token",
        l.n_expert_used,
        l.n_expert,
        layers.len(),
        mib(l.routed_bytes_per_token())
    );
    if l.is_split() {
        let _ = write!(v, "; read from {} shards", l.shards.len());
    }
    if !l.unknown_experts.is_empty() {
        let _ = write!(
            v,
            "; not streamed (left to llama.cpp's mapping): {}",
            l.unknown_experts.join(", ")
        );
    }
    v
}

/// `bmoe inspect MODEL --rpc-layers N`: how `--rpc` would split the model
/// and what each side needs (from the header; the hosts are not asked).
pub fn rpc_split(l: &MoeLayout, blocks: u32) -> String {
    let one_host = l.routed_bytes_per_token();
    let mut split = l.clone();
    let r = split.hand_off(blocks).clone();
    let held = r.held_layers();
    let (embd, vocab) = l.ctx.as_ref().map_or((0, 0), |c| (c.n_embd, c.n_vocab));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "rpc split:        --rpc-layers {}: {held} on the RPC hosts",
        r.blocks
    );
    let _ = writeln!(
        s,
        "  hosts' memory:  {} resident (plus their layers' KV cache)",
        mib(r.remote_bytes)
    );
    let _ = writeln!(
        s,
        "  sent at load:   {} over the network (a host's --cache keeps it for the next load)",
        mib(r.remote_bytes)
    );
    let _ = writeln!(
        s,
        "  this host RAM:  dense {} + the expert cache",
        mib(split.dense_bytes())
    );
    let _ = writeln!(
        s,
        "  this host flash: the whole file, {} (llama.cpp reads the hosts' layers from it at load)",
        mib(l.file_bytes)
    );
    let _ = writeln!(
        s,
        "  streamed here:  {} routed per token (one host: {}), {} expert bytes to cache",
        mib(r.local_routed_bytes_per_token),
        mib(one_host),
        mib(split.expert_bytes())
    );
    let _ = writeln!(
        s,
        "  network/token:  at least {:.1} KiB (the hidden state out, the logits back), plus the \
         graph llama.cpp's RPC client sends with each decode (`bmoe run --rpc` prints the measured total)",
        embd.saturating_add(vocab).saturating_mul(4) as f64 / 1024.0
    );
    s
}

/// The least free memory (bytes) the hosts must report for `--rpc-layers
/// auto` to give them `blocks` blocks: auto keeps an eighth of it back
/// ([`MoeLayout::blocks_fitting`]).
pub fn rpc_free_needed(l: &MoeLayout, blocks: u32) -> u64 {
    l.remote_bytes(blocks).div_ceil(7) * 8
}

/// `bmoe inspect MODEL --rpc-layers auto`: the hosts are not asked here, so
/// what auto would choose for the free memory they might report.
pub fn rpc_auto(l: &MoeLayout) -> String {
    let n = l.blocks();
    let mut counts = vec![n, n * 3 / 4, n / 2, n / 4, 1.min(n), 0];
    counts.dedup();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "rpc split:        --rpc-layers auto: the most last layers whose bytes fit in 7/8 of \
         the free memory the RPC hosts report (asked at the run's start):"
    );
    for c in counts {
        let what = match c {
            0 => "the output layer only".to_string(),
            c if c == n => format!("all {c} layers (nothing streams here)"),
            1 => "the last layer".to_string(),
            c => format!("the last {c} layers"),
        };
        let _ = writeln!(
            s,
            "  {what}: the hosts report at least {} free",
            mib(rpc_free_needed(l, c))
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::layout::ExpertTensor;
    use crate::llama::quant::GgmlType;

    fn layout(experts: Vec<ExpertTensor>, n_expert: u32) -> MoeLayout {
        MoeLayout {
            arch: "x".into(),
            n_layer: 1,
            n_expert,
            n_expert_used: 2,
            experts,
            alignment: 32,
            blocks_in_table: 1,
            ..MoeLayout::default()
        }
    }

    fn expert(name: &str, proj: Proj) -> ExpertTensor {
        ExpertTensor {
            layer: 0,
            proj,
            name: name.into(),
            ggml_type: GgmlType::F32,
            shard: 0,
            file_offset: 0,
            stream_offset: 0,
            slice_bytes: 1024,
            n_expert: 8,
        }
    }

    #[test]
    fn the_verdict_says_why_or_what_streams() {
        assert!(verdict(&layout(vec![], 0)).starts_with("not streamable: a dense model"));
        let mut unknown = layout(vec![], 8);
        unknown.unknown_experts = vec!["blk.0.ffn_up_chexps.weight".into()];
        let v = verdict(&unknown);
        assert!(
            v.starts_with("not streamable") && v.contains("ffn_up_chexps"),
            "{v}"
        );
        let fused = layout(
            vec![
                expert("blk.0.ffn_gate_up_exps.weight", Proj::Gate),
                expert("blk.0.ffn_down_exps.weight", Proj::Down),
            ],
            8,
        );
        let v = verdict(&fused);
        assert!(
            v.starts_with("streamable: 2 of 8") && v.contains("gate+up fused"),
            "{v}"
        );
    }

    #[test]
    fn the_rpc_split_says_what_each_side_holds() {
        let mut l = layout(
            vec![
                expert("blk.0.ffn_gate_exps.weight", Proj::Gate),
                expert("blk.0.ffn_up_exps.weight", Proj::Up),
                expert("blk.0.ffn_down_exps.weight", Proj::Down),
            ],
            8,
        );
        l.tally.block_bytes = BTreeMap::from([(0, 3 * 8 * 1024 + 2048)]);
        l.tally.total_bytes = 3 * 8 * 1024 + 2048 + 4096;
        l.tally.output_bytes = 4096;
        let none = rpc_split(&l, 0);
        assert!(
            none.contains("--rpc-layers 0: the output layer on"),
            "{none}"
        );
        assert!(
            none.contains("streamed here:  0.01 MiB routed per token (one host: 0.01 MiB)"),
            "{none}"
        );
        let all = rpc_split(&l, 1);
        assert!(all.contains("layers 0..=0 and the output layer"), "{all}");
        assert!(
            all.contains("streamed here:  0.00 MiB routed per token"),
            "{all}"
        );
        assert!(all.contains("this host RAM:  dense 0.00 MiB"), "{all}");
    }

    #[test]
    fn auto_gets_exactly_the_layers_its_free_memory_is_said_to_hold() {
        let mut l = layout(Vec::new(), 8);
        l.n_layer = 4;
        l.tally.block_bytes = BTreeMap::from([(0, 7000), (1, 7001), (2, 9000), (3, 123_457)]);
        l.tally.output_bytes = 4096;
        for n in 0..=4 {
            let need = rpc_free_needed(&l, n);
            assert_eq!(l.blocks_fitting(need), n, "{n} blocks at {need}");
            assert!(
                l.blocks_fitting(need - 8) < n.max(1),
                "{n} blocks at {need} - 8"
            );
        }
        let a = rpc_auto(&l);
        assert!(a.contains("--rpc-layers auto"), "{a}");
        assert!(a.contains("all 4 layers"), "{a}");
        assert!(a.contains("the last 2 layers"), "{a}");
        assert!(a.contains("the output layer only"), "{a}");
    }
}
