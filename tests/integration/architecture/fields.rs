//! Issue 74: no struct outside tests has more than [`MOST_FIELDS`] fields
//! (a wider one is several things; its groups want types of their own).

use std::path::{Path, PathBuf};

use syn::visit::Visit;

use super::rust_files;

/// The most fields a struct outside tests may have.
const MOST_FIELDS: usize = 15;

/// `#[cfg(test)]` among `attrs`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

/// A file's structs over the limit and the test-only modules it declares
/// in files of their own (`#[cfg(test)] mod ring_tests;`, with its
/// `#[path]` if it has one).
#[derive(Default)]
struct Scan {
    wide: Vec<(String, usize, usize)>,
    test_mods: Vec<(String, Option<String>)>,
}

impl<'ast> Visit<'ast> for Scan {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            return syn::visit::visit_item_mod(self, m);
        }
        if m.content.is_none() {
            let path = m.attrs.iter().find_map(|a| match &a.meta {
                syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(s),
                        ..
                    }) => Some(s.value()),
                    _ => None,
                },
                _ => None,
            });
            self.test_mods.push((m.ident.to_string(), path));
        }
    }

    fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
        if is_test(&s.attrs) {
            return;
        }
        if s.fields.len() > MOST_FIELDS {
            let line = s.ident.span().start().line;
            self.wide.push((s.ident.to_string(), s.fields.len(), line));
        }
        syn::visit::visit_item_struct(self, s);
    }
}

fn scan(source: &str) -> Result<Scan, syn::Error> {
    let file = syn::parse_file(source)?;
    let mut s = Scan::default();
    s.visit_file(&file);
    Ok(s)
}

/// The paths a test-only module `name` declared in `file` may lie at (its
/// `#[path]`, or `name.rs` and the folder `name/` in the file's module
/// folder).
fn test_paths(file: &Path, name: &str, path: Option<&str>) -> Vec<PathBuf> {
    let dir = file.parent().expect("a file's folder");
    if let Some(p) = path {
        return vec![dir.join(p)];
    }
    let stem = file.file_stem().expect("a file name").to_string_lossy();
    let own = match stem.as_ref() {
        "mod" | "lib" | "main" => dir.to_path_buf(),
        s => dir.join(s),
    };
    vec![own.join(format!("{name}.rs")), own.join(name)]
}

/// `f` under the repository's root, as the test's message shows it.
fn shown(f: &Path) -> &Path {
    f.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(f)
}

/// Every struct over the limit in the files under `srcs`, as
/// `file:line: Name has N fields`, test-only files and modules left out.
fn wide_structs(srcs: &[PathBuf]) -> Vec<String> {
    let mut files = Vec::new();
    for s in srcs {
        rust_files(s, &mut files);
    }
    files.sort();
    let mut scans = Vec::new();
    let mut tests: Vec<PathBuf> = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read a source file");
        let s = scan(&text).unwrap_or_else(|e| panic!("{}: does not parse: {e}", f.display()));
        for (name, path) in &s.test_mods {
            tests.extend(test_paths(f, name, path.as_deref()));
        }
        scans.push((f, s));
    }
    let in_tests = |f: &Path| tests.iter().any(|t| f.starts_with(t));
    scans
        .into_iter()
        .filter(|(f, _)| !in_tests(f))
        .flat_map(|(f, s)| {
            s.wide
                .into_iter()
                .map(move |(n, k, l)| format!("{}:{l}: {n} has {k} fields", shown(f).display()))
        })
        .collect()
}

/// Issue 74: no struct of `src/` or a crate's `src/` outside tests has more
/// than 15 fields.
#[test]
fn no_struct_outside_tests_has_more_than_fifteen_fields() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut srcs = vec![root.join("src")];
    for e in std::fs::read_dir(root.join("crates")).expect("read crates/") {
        srcs.push(e.expect("an entry").path().join("src"));
    }
    let wide = wide_structs(&srcs);
    assert!(
        wide.is_empty(),
        "structs over {MOST_FIELDS} fields:\n{}",
        wide.join("\n")
    );
}

/// A planted 16-field struct is found; the same in a test module, behind
/// `#[cfg(test)]` or with 15 fields is not; a test-only file is skipped.
#[test]
fn a_planted_wide_struct_is_found() {
    let fields = |n: usize| (0..n).map(|i| format!("f{i}: u8,")).collect::<String>();
    let wide = format!("struct Wide {{ {} }}", fields(16));
    let s = scan(&wide).unwrap();
    assert_eq!(s.wide, vec![("Wide".to_string(), 16, 1)]);
    let narrow = format!("pub struct Narrow {{ {} }}", fields(15));
    assert!(scan(&narrow).unwrap().wide.is_empty());
    let tuple = format!("struct T({});", "u8,".repeat(16));
    assert_eq!(scan(&tuple).unwrap().wide.len(), 1, "a tuple struct counts");
    let in_fn = format!("fn f() {{ {wide} }}");
    assert_eq!(scan(&in_fn).unwrap().wide.len(), 1, "inside a function too");
    let tested = format!("#[cfg(test)] mod tests {{ {wide} }}");
    assert!(scan(&tested).unwrap().wide.is_empty());
    let gated = format!("#[cfg(test)] {wide}");
    assert!(scan(&gated).unwrap().wide.is_empty());

    let dir = std::env::temp_dir().join(format!("bmoe-wide-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    let decl = "mod a;\n#[cfg(test)]\nmod helper;\n#[cfg(test)]\n#[path = \"a/b_tests.rs\"]\nmod b_tests;\n";
    std::fs::write(src.join("lib.rs"), decl).unwrap();
    std::fs::write(src.join("helper.rs"), &wide).unwrap();
    std::fs::write(src.join("a/b_tests.rs"), &wide).unwrap();
    assert!(wide_structs(std::slice::from_ref(&src)).is_empty());
    std::fs::write(src.join("a/mod.rs"), &wide).unwrap();
    let found = wide_structs(std::slice::from_ref(&src));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].ends_with("a/mod.rs:1: Wide has 16 fields"),
        "{found:?}"
    );
}
