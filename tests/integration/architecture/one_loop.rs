//! Issue 74: one function drives generation for `bmoe run`, `chat` and
//! `serve`: the generation loop's step, `Multi::step` in
//! src/generate/step.rs. It is the one place outside the FFI room that
//! decodes a batch of a generation, and each command reaches it: run and chat
//! through `generate_opts` (one sequence), serve's worker directly.

use std::path::Path;

use syn::visit::Visit;

use super::rust_files;

/// The loop's step: the file and function that decode a generation's batch.
const STEP: (&str, &str) = ("src/generate/step.rs", "step");

/// Decoding that is not a generation: the fixture capture feeds a prompt
/// through a context to record the FFN inputs its clustered router is
/// trained on, and picks no token.
const NOT_GENERATION: [&str; 1] = ["src/fixture/capture.rs"];

/// What each function of a file calls: (function, callee, line), and
/// whether the callee is a method (`ctx.decode(..)`, not `decode(..)`).
#[derive(Default)]
struct Calls {
    within: Vec<String>,
    calls: Vec<(String, String, usize, bool)>,
}

impl<'ast> Visit<'ast> for Calls {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.within.push(f.sig.ident.to_string());
        syn::visit::visit_item_fn(self, f);
        self.within.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.within.push(f.sig.ident.to_string());
        syn::visit::visit_impl_item_fn(self, f);
        self.within.pop();
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        let within = self.within.last().cloned().unwrap_or_default();
        let line = m.method.span().start().line;
        self.calls.push((within, m.method.to_string(), line, true));
        syn::visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*c.func {
            if let Some(last) = p.path.segments.last() {
                let within = self.within.last().cloned().unwrap_or_default();
                let line = last.ident.span().start().line;
                self.calls
                    .push((within, last.ident.to_string(), line, false));
            }
        }
        syn::visit::visit_expr_call(self, c);
    }
}

pub(super) fn calls(source: &str) -> Vec<(String, String, usize, bool)> {
    let file = syn::parse_file(source).expect("a Rust file that parses");
    let mut c = Calls::default();
    c.visit_file(&file);
    c.calls
}

/// The `.decode(..)` calls of `source` (named `file`) that are not the loop's
/// step, as file:line (function).
fn stray_decodes(file: &str, source: &str) -> Vec<String> {
    calls(source)
        .into_iter()
        .filter(|(within, callee, _, method)| {
            *method && callee == "decode" && (file, within.as_str()) != STEP
        })
        .map(|(within, _, line, _)| format!("{file}:{line} (in {within})"))
        .collect()
}

/// Whether function `within` of `source` calls `callee`.
pub(super) fn calls_in(source: &str, within: &str, callee: &str) -> bool {
    calls(source)
        .iter()
        .any(|(w, c, _, _)| w == within && c == callee)
}

pub(super) fn read(rel: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every file of src/ outside the FFI room (src/llama/), as its path from
/// the root and its source.
pub(super) fn src_outside_ffi() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(root).expect("under the root");
            let rel = rel.to_string_lossy().replace('\\', "/");
            let source = || std::fs::read_to_string(f).expect("read");
            (!rel.starts_with("src/llama/")).then(|| (rel, source()))
        })
        .collect()
}

#[test]
fn only_the_loops_step_decodes_a_generation_and_every_command_reaches_it() {
    let stray: Vec<String> = src_outside_ffi()
        .iter()
        .filter(|(rel, _)| !NOT_GENERATION.contains(&rel.as_str()))
        .flat_map(|(rel, source)| stray_decodes(rel, source))
        .collect();
    assert!(stray.is_empty(), "decodes outside {STEP:?}: {stray:#?}");
    assert!(
        calls_in(&read(STEP.0), STEP.1, "decode"),
        "the step decodes"
    );
    // run and chat: one generation through the loop; serve: the loop itself.
    let verify = read("src/generate/verify.rs");
    assert!(calls_in(&verify, "generate_opts", "step"));
    assert!(calls_in(
        &read("src/engine/run.rs"),
        "generate_metered",
        "generate_opts"
    ));
    assert!(calls_in(
        &read("src/engine/session.rs"),
        "generate",
        "generate_opts"
    ));
    assert!(calls_in(&read("src/serve/worker.rs"), "serve_jobs", "step"));
}

#[test]
fn a_planted_second_loop_is_found() {
    let planted = "impl Loop { fn until_stop(&mut self) { self.ctx.decode(&self.batch); } }
        fn step() { ctx.decode(&b); decode(&bytes); }";
    assert_eq!(
        stray_decodes("src/generate/verify.rs", planted),
        [
            "src/generate/verify.rs:1 (in until_stop)",
            "src/generate/verify.rs:2 (in step)"
        ]
    );
    assert_eq!(
        stray_decodes(STEP.0, planted),
        ["src/generate/step.rs:1 (in until_stop)"]
    );
    assert!(calls_in(planted, "step", "decode"));
    assert!(!calls_in(planted, "until_stop", "step"));
}
