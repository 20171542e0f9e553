//! Issue 65: no import cycle among the files of a folder of `src/`, read
//! on the same module graph as the import rules (`super::named_paths`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{module_path, named_paths, rust_files};

/// The module graph of a folder's files: each module's path and the
/// files of the same folder it names (by the longest module path that
/// starts what it names; a name of a folder's `mod.rs` reaches that file,
/// re-exports included). A `mod` declaration is no edge. A file's inline
/// `mod tests` is a module of its own, as a `_tests.rs` file beside it is
/// ([`graph_module`]): what it names are its edges, not the file's.
fn file_graph(files: &[(Vec<String>, String)]) -> Vec<(String, BTreeSet<String>)> {
    let modules: Vec<&Vec<String>> = files.iter().map(|(m, _)| m).collect();
    let mut graph: Vec<(String, BTreeSet<String>)> = Vec::new();
    for (module, source) in files {
        let named = named_paths(module, source)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", module.join("::")));
        graph.push((module.join("::"), BTreeSet::new()));
        for (from, abs) in named {
            let node = test_module(module, &from).unwrap_or_else(|| module.clone());
            let reached = modules
                .iter()
                .filter(|m| abs.starts_with(m))
                .max_by_key(|m| m.len());
            let Some(to) = reached.filter(|m| ***m != node) else {
                continue;
            };
            let node = node.join("::");
            let at = match graph.iter().position(|(f, _)| *f == node) {
                Some(at) => at,
                None => {
                    graph.push((node, BTreeSet::new()));
                    graph.len() - 1
                }
            };
            graph[at].1.insert(to.join("::"));
        }
    }
    graph
}

/// The inline test module (`module::tests`) that `from`, a module a file
/// of `module` names something in, lies in, if it does.
fn test_module(module: &[String], from: &[String]) -> Option<Vec<String>> {
    let inside = from.len() > module.len() && from.starts_with(module);
    (inside && from[module.len()] == "tests").then(|| from[..=module.len()].to_vec())
}

/// One import cycle of the graph (its files in order, the first again at
/// the end), if it has one: a depth-first walk that meets a file still on
/// its path.
fn import_cycle(graph: &[(String, BTreeSet<String>)]) -> Option<Vec<String>> {
    fn walk<'a>(
        at: &'a str,
        graph: &'a [(String, BTreeSet<String>)],
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(from) = path.iter().position(|f| *f == at) {
            let mut cycle: Vec<String> = path[from..].iter().map(|f| f.to_string()).collect();
            cycle.push(at.to_string());
            return Some(cycle);
        }
        if !done.insert(at) {
            return None;
        }
        path.push(at);
        let next = graph.iter().find(|(f, _)| f == at).map(|(_, n)| n);
        for n in next.into_iter().flatten() {
            if let Some(c) = walk(n, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .iter()
        .find_map(|(f, _)| walk(f, graph, &mut Vec::new(), &mut done))
}

/// The module path of a file for the graph: as [`module_path`], but a
/// test file beside its module (`reply_tests.rs` beside `reply.rs`, read
/// in through `#[path]`) is that module's `tests`.
fn graph_module(src: &Path, rel: &Path) -> Vec<String> {
    let mut module = module_path(rel);
    let stem = rel.file_stem().map(|s| s.to_string_lossy().into_owned());
    if let Some(base) = stem.as_deref().and_then(|s| s.strip_suffix("_tests")) {
        if src.join(rel).with_file_name(format!("{base}.rs")).exists() {
            module.pop();
            module.push(base.to_string());
            module.push("tests".to_string());
        }
    }
    module
}

/// The files of folder `dir` of the crate whose sources lie in `src`, each
/// with its module path and text: every file under it, and its face when
/// that is a file beside the folder (`cli.rs` beside `cli/`).
fn folder_files(src: &Path, dir: &Path) -> Vec<(Vec<String>, String)> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let face = dir.with_extension("rs");
    if dir != src && face.is_file() {
        files.push(face);
    }
    files.sort();
    files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(src).expect("under src/");
            let text = std::fs::read_to_string(f).expect("read a source file");
            (graph_module(src, rel), text)
        })
        .collect()
}

/// Every folder under `src`, nested ones too (each is read with all it
/// holds, so a circle through a nested folder's files shows in its
/// parent's graph as well as in its own).
fn folders(src: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![src.to_path_buf()];
    let mut at = 0;
    while at < dirs.len() {
        let mut sub: Vec<PathBuf> = std::fs::read_dir(&dirs[at])
            .expect("read a folder")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.is_dir())
            .collect();
        sub.sort();
        dirs.extend(sub);
        at += 1;
    }
    dirs.remove(0);
    dirs
}

/// The files of `src/<folder>/` (its `mod.rs` the face).
fn src_folder(folder: &str) -> Vec<(Vec<String>, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    folder_files(&src, &src.join(folder))
}

/// The folders whose `mod.rs` is only a face: none of their files names an
/// item through it (they import each other by path, `super::config::X`).
const FACE_FOLDERS: [&str; 4] = ["engine", "generate", "layout", "prompt_cache"];

/// The files of `files` (a folder's, the first module its face) that name
/// an item through the face.
fn through_the_face(files: &[(Vec<String>, String)]) -> Vec<String> {
    let face = &files
        .iter()
        .map(|(m, _)| m)
        .min_by_key(|m| m.len())
        .expect("a folder's files")
        .clone();
    file_graph(files)
        .into_iter()
        .filter(|(_, reached)| reached.contains(&face.join("::")))
        .map(|(f, _)| f)
        .collect()
}

/// The folders whose files must not import each other in a circle: every
/// folder under `src/` and each crate's, and each crate's own sources (its
/// root's files; bmoe's own root is its rooms, held to the room table).
fn checked_folders() -> Vec<(PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut out: Vec<(PathBuf, PathBuf)> = folders(&src)
        .into_iter()
        .map(|d| (src.clone(), d))
        .collect();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .map(|e| e.expect("an entry").path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    crates.sort();
    for c in crates {
        out.push((c.clone(), c.clone()));
        out.extend(folders(&c).into_iter().map(|d| (c.clone(), d)));
    }
    out
}

/// Issue 65 for the server's and chat's rooms, issue 74 for every folder
/// of `src/` and `crates/`: no two files of a folder import each other in
/// a circle (a face re-exports its files' items and names none of theirs
/// back; an item its files share lies in a file of its own).
#[test]
fn no_import_cycle_among_the_files_of_any_folder() {
    let folders = checked_folders();
    assert!(folders.len() >= 35, "only {} folders", folders.len());
    for (src, dir) in folders {
        let files = folder_files(&src, &dir);
        let graph = file_graph(&files);
        if files.len() > 2 {
            // Each file is named by at least one other (its face, a sibling):
            // fewer edges would mean the paths were not read.
            let edges: usize = graph.iter().map(|(_, n)| n.len()).sum();
            assert!(
                edges >= files.len() - 1,
                "{}: only {edges} imports",
                dir.display()
            );
        }
        if let Some(cycle) = import_cycle(&graph) {
            panic!(
                "{} has an import cycle: {}",
                dir.display(),
                cycle.join(" -> ")
            );
        }
    }
}

#[test]
fn no_file_of_a_face_folder_imports_through_its_face() {
    for folder in FACE_FOLDERS {
        let files = src_folder(folder);
        assert!(files.len() > 2, "{folder}: {} files", files.len());
        let through = through_the_face(&files);
        assert!(
            through.is_empty(),
            "src/{folder}/: {through:?} name items through {folder}/mod.rs; import them by path"
        );
    }
}

/// A planted file of a test tree: its module path (`a::b`) and source.
fn file(module: &str, source: &str) -> (Vec<String>, String) {
    let m: Vec<String> = module.split("::").map(str::to_string).collect();
    (m, source.to_string())
}

#[test]
fn a_file_naming_its_face_is_found() {
    let mut tree = vec![
        file("engine", "mod config; mod run; pub use config::RunConfig;"),
        file("engine::config", "pub struct RunConfig;"),
        file(
            "engine::run",
            "use super::config::RunConfig; fn f(_: RunConfig) {}",
        ),
    ];
    assert!(through_the_face(&tree).is_empty());
    tree[2] = file("engine::run", "use super::RunConfig; fn f(_: RunConfig) {}");
    assert_eq!(through_the_face(&tree), ["engine::run"]);
    tree[2] = file("engine::run", "fn f(_: crate::engine::RunConfig) {}");
    assert_eq!(through_the_face(&tree), ["engine::run"]);
}

/// The files `file` names in `graph` (a test's view of one node).
fn edges_of(graph: &[(String, BTreeSet<String>)], file: &str) -> BTreeSet<String> {
    let node = graph.iter().find(|(g, _)| g == file);
    node.unwrap_or_else(|| panic!("{file} is no node"))
        .1
        .clone()
}

#[test]
fn a_planted_import_cycle_is_found() {
    // A dialect, the job's leaf and the routes: no cycle.
    let mut tree = vec![
        file("serve", "mod job; mod d; mod routes; use routes::router;"),
        file("serve::job", "pub struct JobSpec; pub fn now() {}"),
        file("serve::d", "mod reply; pub use reply::Reply;"),
        file(
            "serve::d::reply",
            "use crate::serve::job::JobSpec; fn f() { super::super::job::now() }",
        ),
        file(
            "serve::d::reply::tests",
            "use super::*; use crate::serve::d::Reply;",
        ),
        file(
            "serve::routes",
            "use super::d; use super::job::{self, JobSpec};",
        ),
    ];
    let graph = file_graph(&tree);
    assert_eq!(import_cycle(&graph), None, "{graph:?}");
    let reached = |f: &str| edges_of(&graph, f);
    assert_eq!(
        reached("serve::routes"),
        ["serve::d", "serve::job"].map(String::from).into()
    );
    assert_eq!(
        reached("serve::d::reply"),
        ["serve::job"].map(String::from).into()
    );
    assert_eq!(reached("serve"), ["serve::routes"].map(String::from).into());
    assert_eq!(
        reached("serve::d"),
        ["serve::d::reply"].map(String::from).into()
    );
    // The leaf names a dialect back, through a macro's tokens: a cycle.
    tree[1] = file(
        "serve::job",
        "pub struct JobSpec; fn g() { println!(\"{}\", crate::serve::d::reply::X); }",
    );
    let cycle = import_cycle(&file_graph(&tree)).expect("the planted cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert!(cycle.contains(&"serve::job".to_string()), "{cycle:?}");
    assert!(cycle.contains(&"serve::d::reply".to_string()), "{cycle:?}");
    // A child naming its parent's own item while the parent names it.
    tree[1] = file("serve::job", "pub struct JobSpec;");
    tree[3] = file(
        "serve::d::reply",
        "use super::Reply; use super::super::job::JobSpec;",
    );
    let cycle = import_cycle(&file_graph(&tree)).expect("parent and child");
    assert_eq!(
        cycle,
        ["serve::d", "serve::d::reply", "serve::d"].map(String::from)
    );
}

#[test]
fn an_inline_test_module_is_a_module_of_its_own() {
    // The face re-exports the leaf; the leaf's tests name the face: the
    // tests are `serve::job::tests`, beside the leaf, so no circle.
    let mut tree = vec![
        file("serve", "mod job; pub use job::JobSpec;"),
        file(
            "serve::job",
            "pub struct JobSpec; #[cfg(test)] mod tests { use crate::serve::JobSpec; }",
        ),
    ];
    let graph = file_graph(&tree);
    assert_eq!(import_cycle(&graph), None, "{graph:?}");
    let reached = |f: &str| edges_of(&graph, f);
    assert_eq!(
        reached("serve::job::tests"),
        ["serve"].map(String::from).into()
    );
    // The same name outside the tests is a circle.
    tree[1] = file(
        "serve::job",
        "pub struct JobSpec; fn f(_: crate::serve::JobSpec) {}",
    );
    let cycle = import_cycle(&file_graph(&tree)).expect("leaf and face");
    assert_eq!(cycle, ["serve", "serve::job", "serve"].map(String::from));
}
