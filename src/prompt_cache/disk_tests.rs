use std::path::Path;
use std::time::{Duration, SystemTime};

use super::*;
use crate::prompt_cache::entry::write_entry;
use crate::prompt_cache::owned::TEMP_PREFIX;

use crate::prompt_cache::entry::tests::ident;

fn put(idx: &DiskIndex, tokens: &[i32], bytes: usize) -> PathBuf {
    let p = idx.path_of(tokens);
    write_entry(&p, &ident(), tokens, &vec![7; bytes]).unwrap();
    p
}

fn age(p: &Path, secs: u64) {
    let f = std::fs::File::open(p).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs))
        .unwrap();
}

#[test]
fn the_longest_prefix_on_disk_is_found_and_a_damaged_file_skipped() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    owned::make_folder(&dir).unwrap();
    let mut idx = DiskIndex::new(dir.clone());
    put(&idx, &[1, 2, 3], 10);
    let long = put(&idx, &[1, 2, 3, 4, 5], 10);
    std::fs::write(dir.join("junk.bpc"), b"BMOEPC").unwrap();
    let (p, c) = idx.best(&[1, 2, 3, 4, 9], &ident(), 0).unwrap();
    assert_eq!((p, c), (long.clone(), 4));
    assert!(
        idx.best(&[1, 2, 3, 4, 9], &ident(), 4).is_none(),
        "not past the floor"
    );
    assert!(idx.covers(&[1, 2]) && !idx.covers(&[2]));
    idx.remove_covered_by(&[1, 2, 3, 4, 5, 6]);
    assert!(!long.exists());
    let other = Ident {
        state_streams: 2,
        ..ident()
    };
    assert!(
        DiskIndex::new(dir).best(&[1, 2, 3], &other, 0).is_none(),
        "foreign ident"
    );
}

/// An entry written with a larger `-c` restores where its tokens fit and
/// is skipped (never offered, nor an error) where they do not.
#[test]
fn an_entry_of_another_context_size_is_offered_where_it_fits() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    owned::make_folder(&dir).unwrap();
    let big = Ident {
        n_ctx: 4096,
        ..ident()
    };
    let idx = DiskIndex::new(dir.clone());
    let tokens: Vec<i32> = (0..100).collect();
    write_entry(&idx.path_of(&tokens), &big, &tokens, &[7; 8]).unwrap();
    let fits = Ident {
        n_ctx: 100,
        ..big.clone()
    };
    let (_, common) = DiskIndex::new(dir.clone())
        .best(&tokens[..50], &fits, 0)
        .unwrap();
    assert_eq!(common, 50);
    let small = Ident { n_ctx: 99, ..big };
    let mut idx = DiskIndex::new(dir);
    assert!(idx.best(&tokens[..50], &small, 0).is_none(), "too long");
    assert!(!idx.covers(&tokens[..10]), "not a candidate");
}

#[test]
fn the_cap_is_kept_oldest_first_over_every_folder() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    owned::make_folder(&a).unwrap();
    owned::make_folder(&b).unwrap();
    let (ia, ib) = (DiskIndex::new(a), DiskIndex::new(b));
    let old = put(&ia, &[1], 1000);
    let mid = put(&ib, &[2], 1000);
    let new = put(&ia, &[3], 1000);
    age(&old, 30);
    age(&mid, 20);
    age(&new, 10);
    let each = std::fs::metadata(&old).unwrap().len();
    assert!(make_room(root.path(), 3 * each, each));
    assert!(!old.exists() && mid.exists() && new.exists());
    touch(&mid);
    assert!(make_room(root.path(), 2 * each, each));
    assert!(mid.exists() && !new.exists(), "a touched file is kept");
    assert!(dir_bytes(root.path()) <= each);
    assert!(
        !make_room(root.path(), each, each + 1),
        "bigger than the cap"
    );
}

#[test]
fn a_stale_temporary_file_is_removed_and_a_fresh_one_counted() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    owned::make_folder(&dir).unwrap();
    let stale = dir.join(format!("{TEMP_PREFIX}1-2-x.bpc"));
    let fresh = dir.join(format!("{TEMP_PREFIX}1-3-x.bpc"));
    std::fs::write(&stale, [0; 100]).unwrap();
    std::fs::write(&fresh, [0; 100]).unwrap();
    age(&stale, STALE_TEMP.as_secs() + 60);
    assert_eq!(dir_bytes(root.path()), 100);
    assert!(!stale.exists());
    let mut idx = DiskIndex::new(dir);
    idx.refresh(&ident());
    assert!(!idx.knows(&fresh), "a temporary file is never an entry");
}

/// Issue 64, finding 1: eviction over a directory that also holds a model,
/// documents, a folder of another tool and a symlinked folder removes the
/// cache's entries only.
#[test]
fn eviction_removes_the_caches_entries_and_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let r = root.path();
    let decoys: Vec<PathBuf> = vec![
        r.join("bmoe/model.gguf"),
        r.join("pip/x.json"),
        r.join("Documents/letter.docx"),
        r.join("notes.txt"),
        // Named like an entry, in a folder the cache did not make.
        r.join("pip/old.bpc"),
        outside.path().join("kept.bpc"),
        outside.path().join("thesis.docx"),
    ];
    for d in &decoys {
        std::fs::create_dir_all(d.parent().unwrap()).unwrap();
        std::fs::write(d, vec![1u8; 4096]).unwrap();
        age(d, 3600);
    }
    std::os::unix::fs::symlink(outside.path(), r.join("linked")).unwrap();
    let dir = r.join("cachefolder");
    owned::make_folder(&dir).unwrap();
    // A file in the cache's own folder that is not an entry, and a symlink
    // named like one that points at a decoy.
    std::fs::write(dir.join("readme.bpc"), b"not an entry").unwrap();
    std::os::unix::fs::symlink(&decoys[0], dir.join("x.bpc")).unwrap();
    let idx = DiskIndex::new(dir.clone());
    let e1 = put(&idx, &[1], 1000);
    let e2 = put(&idx, &[2], 1000);
    assert_eq!(dir_bytes(r), 2 * std::fs::metadata(&e1).unwrap().len());
    assert!(make_room(r, 1, 1), "room made from the entries alone");
    assert!(!e1.exists() && !e2.exists());
    for d in &decoys {
        assert_eq!(
            std::fs::read(d).unwrap(),
            vec![1u8; 4096],
            "{}",
            d.display()
        );
    }
    assert!(dir.join("readme.bpc").exists() && dir.join("x.bpc").is_symlink());
}

/// Issue 64, finding 4: a FIFO named like an entry is never opened.
#[test]
fn a_fifo_named_like_an_entry_is_skipped_without_opening_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    owned::make_folder(&dir).unwrap();
    let mut idx = DiskIndex::new(dir.clone());
    let good = put(&idx, &[1, 2, 3], 10);
    let fifo = dir.join("fifo.bpc");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (p, _) = idx.best(&[1, 2, 3, 4], &ident(), 0).unwrap();
    assert_eq!(p, good);
    assert!(!idx.knows(&fifo));
    assert!(make_room(root.path(), 1 << 20, 1));
    assert!(fifo.exists(), "not removed either");
    assert!(!crate::prompt_cache::entry::is_cache_file(&fifo));
}

#[test]
fn entries_are_private_to_their_owner() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    owned::make_folder(&dir).unwrap();
    let p = put(&DiskIndex::new(dir), &[5], 10);
    let mode = std::fs::metadata(&p).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}
