//! docs/architecture.md's import rules, checked on the module graph.
//!
//! Every file under `src/` is parsed (syn) and every path in it resolved to
//! the room it names: `use` trees (renames included, so `use crate::chat as
//! c` is caught where it is written), paths in types, expressions and
//! patterns, macro paths, and the tokens inside macro calls (`format!("{}",
//! crate::chat::x())`). `crate::`, `self::` and `super::` are resolved from the
//! file's module (and any inline `mod` it sits in); a bare name is an item the
//! file brought in through one of those paths, or another crate. The rules
//! below are the table "Rooms and who may import whom"; a planted violation of
//! each is caught by `a_planted_violation_of_each_rule_is_caught`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

mod crates;
mod cycles;
mod fields;
mod one_loop;
mod one_state_path;
mod planted;

/// One room of docs/architecture.md: the top-level modules it is made of and
/// what it may import besides itself (rooms whole, or single items).
struct Room {
    name: &'static str,
    modules: &'static [&'static str],
    may_import: &'static [&'static str],
    /// Single items of rooms it may not import whole, as `room::item`.
    items: &'static [&'static str],
}

/// Rooms everything may use: signals, checked output, the trace layer and
/// files opened without blocking.
const EVERYONE: [&str; 4] = ["interrupt", "stdio", "chrome_trace", "user_file"];

/// The table, row by row (docs/architecture.md, "Rooms and who may import
/// whom"). The binary's edge, `cli`, may import every room and is not listed.
const ROOMS: [Room; 14] = [
    Room {
        name: "lab",
        modules: &["lab"],
        may_import: &["layout", "stream"],
        items: &[],
    },
    Room {
        name: "serve",
        modules: &["serve"],
        may_import: &["engine", "chat", "generate", "llama", "prompt_cache"],
        items: &[],
    },
    Room {
        name: "chat",
        modules: &["chat"],
        may_import: &["llama"],
        items: &[],
    },
    Room {
        name: "engine",
        modules: &["engine"],
        may_import: &[
            "draft",
            "generate",
            "chat",
            "stream",
            "layout",
            "llama",
            "prompt_cache",
        ],
        items: &[],
    },
    Room {
        name: "generate",
        modules: &["generate"],
        may_import: &["chat", "llama"],
        items: &[],
    },
    Room {
        name: "draft",
        modules: &["draft"],
        may_import: &["generate", "stream", "llama"],
        items: &[],
    },
    Room {
        name: "stream",
        modules: &["stream"],
        may_import: &["layout", "llama"],
        items: &["fixture::cache_dir"],
    },
    Room {
        name: "layout",
        modules: &["layout"],
        may_import: &["llama"],
        items: &[],
    },
    Room {
        name: "llama",
        modules: &["llama"],
        may_import: &[],
        items: &[],
    },
    Room {
        name: "fixture",
        modules: &["fixture"],
        may_import: &["llama"],
        items: &[],
    },
    Room {
        name: "forecast",
        modules: &["forecast"],
        may_import: &["layout", "stream"],
        items: &[],
    },
    Room {
        name: "inspect",
        modules: &["inspect"],
        may_import: &["layout", "llama"],
        items: &[],
    },
    Room {
        name: "prompt_cache",
        modules: &["prompt_cache"],
        may_import: &[],
        items: &[],
    },
    Room {
        name: "edges",
        modules: &EVERYONE,
        may_import: &[],
        items: &[],
    },
];

/// The room a top-level module belongs to; `None` for the binary's edge and
/// for names that are not bmoe's modules.
fn room_of(module: &str) -> Option<&'static Room> {
    ROOMS.iter().find(|r| r.modules.contains(&module))
}

/// One path that crosses a rule: where, and what it names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    line: usize,
    from: &'static str,
    path: String,
}

/// Whether `room` may name the absolute path `abs` (bmoe's module path,
/// without `crate`).
fn allowed(room: &Room, abs: &[String]) -> bool {
    let Some(first) = abs.first() else {
        return true;
    };
    let Some(target) = room_of(first) else {
        return true; // not a room: another crate, a local item, lib.rs itself
    };
    if target.name == room.name
        || EVERYONE.contains(&first.as_str())
        || room.may_import.contains(&target.name)
    {
        return true;
    }
    let item = abs.iter().take(2).cloned().collect::<Vec<_>>().join("::");
    room.items.contains(&item.as_str())
}

/// Resolve `segments` (as written) from module `module` to bmoe's absolute
/// module path; `None` when the path does not start at bmoe's root.
fn resolve(module: &[String], segments: &[String]) -> Option<Vec<String>> {
    let first = segments.first()?;
    match first.as_str() {
        "crate" | "bmoe" => Some(segments[1..].to_vec()),
        "self" => Some(module.iter().chain(&segments[1..]).cloned().collect()),
        "super" => {
            let ups = segments.iter().take_while(|s| *s == "super").count();
            let keep = module.len().checked_sub(ups)?;
            Some(
                module[..keep]
                    .iter()
                    .chain(&segments[ups..])
                    .cloned()
                    .collect(),
            )
        }
        _ => None,
    }
}

/// The visitor over one file: its room, its module path (inline `mod`s
/// pushed as they are entered), and what it found.
/// A path a file names, absolute, and the module (the file's or an inline
/// one's) that names it.
type Named = (Vec<String>, Vec<String>);

struct Checker {
    room: &'static Room,
    module: Vec<String>,
    found: Vec<Violation>,
    /// Every path of bmoe the file names, absolute, each with the module
    /// (the file's or an inline one's) that names it: the module graph.
    named: Vec<Named>,
    /// The modules the file declares (`mod reply;`): a bare path starting
    /// with one of them (`reply::Head`) names it, outside inline `mod`s.
    children: Vec<String>,
    /// The file's own module's depth (inline `mod`s go deeper).
    depth: usize,
}

impl Checker {
    fn new(room: &'static Room, module: &[String], file: &syn::File) -> Self {
        let children = file
            .items
            .iter()
            .filter_map(|i| match i {
                syn::Item::Mod(m) => Some(m.ident.to_string()),
                _ => None,
            })
            .collect();
        Self {
            room,
            module: module.to_vec(),
            found: Vec::new(),
            named: Vec::new(),
            children,
            depth: module.len(),
        }
    }

    /// `segments` from the file's module: `crate::`, `self::`, `super::`,
    /// or a bare path into a module the file declares.
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let child = segments.len() > 1
            && self.module.len() == self.depth
            && self.children.contains(&segments[0]);
        if child {
            return Some(self.module.iter().chain(segments).cloned().collect());
        }
        resolve(&self.module, segments)
    }

    fn check(&mut self, segments: &[String], line: usize) {
        if let Some(abs) = self.absolute(segments) {
            self.named.push((self.module.clone(), abs.clone()));
            if !allowed(self.room, &abs) {
                self.found.push(Violation {
                    line,
                    from: self.room.name,
                    path: segments.join("::"),
                });
            }
        }
    }

    /// Each full path of a `use` tree (a group splits into its branches).
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        use syn::UseTree as T;
        match tree {
            T::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            T::Name(n) => self.use_leaf(prefix, n.ident.to_string(), n.ident.span()),
            T::Rename(r) => self.use_leaf(prefix, r.ident.to_string(), r.ident.span()),
            T::Glob(g) => {
                let line = g.star_token.spans[0].start().line;
                self.check(prefix, line);
            }
            T::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    fn use_leaf(&mut self, prefix: &mut Vec<String>, leaf: String, span: proc_macro2::Span) {
        prefix.push(leaf);
        self.check(prefix, span.start().line);
        prefix.pop();
    }

    /// Paths inside a macro call's tokens: `ident :: ident :: ...` runs.
    fn tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let (mut line, mut colons) = (0, 0);
        for tt in tokens {
            match tt {
                TokenTree::Ident(i) => {
                    if colons != 2 {
                        self.end_run(&mut run, line);
                        line = i.span().start().line;
                    }
                    run.push(i.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => {
                    colons += 1;
                }
                other => {
                    self.end_run(&mut run, line);
                    colons = 0;
                    if let TokenTree::Group(g) = other {
                        self.tokens(g.stream());
                    }
                }
            }
        }
        self.end_run(&mut run, line);
    }

    fn end_run(&mut self, run: &mut Vec<String>, line: usize) {
        if run.len() > 1 {
            self.check(run, line);
        }
        run.clear();
    }
}

impl<'ast> Visit<'ast> for Checker {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.check(&segments, line);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    /// `pub(super)` and `pub(crate)` say who may see an item, not what it
    /// names.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }
}

/// The violations in one file's `source`, whose module path is `module`
/// (its first segment names the room); none for the binary's edge.
fn violations(module: &[String], source: &str) -> Result<Vec<Violation>, syn::Error> {
    let Some(room) = module.first().and_then(|m| room_of(m)) else {
        return Ok(Vec::new());
    };
    let file = syn::parse_file(source)?;
    let mut c = Checker::new(room, module, &file);
    c.visit_file(&file);
    c.found.sort();
    c.found.dedup();
    Ok(c.found)
}

/// Every absolute path of bmoe that `source`, the file of module `module`
/// (in a room), names: `use` trees, paths, macro tokens, `super::` and
/// `self::` resolved, as [`violations`] reads them; each with the module
/// that names it (`module`, or an inline `mod` of the file below it).
fn named_paths(module: &[String], source: &str) -> Result<Vec<Named>, syn::Error> {
    // The binary's edge, cli, has no row of the table: its files are read
    // as the edges' (the room only matters to `violations`).
    let room = module
        .first()
        .and_then(|m| room_of(m))
        .unwrap_or(&ROOMS[ROOMS.len() - 1]);
    let file = syn::parse_file(source)?;
    let mut c = Checker::new(room, module, &file);
    c.visit_file(&file);
    Ok(c.named)
}

/// The module path of a file under `src/` (`engine/mod.rs` is `engine`,
/// `engine/sink.rs` is `engine::sink`); the crate roots are empty.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir)
        .expect("read src/")
        .map(|e| e.expect("an entry"))
    {
        let path = e.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

fn modules(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_file_keeps_the_import_rules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut checked = BTreeSet::new();
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src/");
        let module = module_path(rel);
        let text = std::fs::read_to_string(f).expect("read a source file");
        let found = violations(&module, &text)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", f.display()));
        if let Some(r) = module.first().and_then(|m| room_of(m)) {
            checked.insert(r.name);
        }
        bad.extend(found.into_iter().map(|v| {
            format!(
                "{}:{}: {} may not name {}",
                rel.display(),
                v.line,
                v.from,
                v.path
            )
        }));
    }
    assert_eq!(
        checked.len(),
        ROOMS.len(),
        "every room of the table has files: {checked:?}"
    );
    assert!(
        bad.is_empty(),
        "imports against docs/architecture.md:\n{}",
        bad.join("\n")
    );
}
