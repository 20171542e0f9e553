use std::path::Path;
use std::time::{Duration, SystemTime};

use super::*;
use crate::prompt_cache::entry::write_entry;

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
    std::fs::create_dir(&dir).unwrap();
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
        n_ctx: 9,
        ..ident()
    };
    assert!(
        DiskIndex::new(dir).best(&[1, 2, 3], &other, 0).is_none(),
        "foreign ident"
    );
}

#[test]
fn the_cap_is_kept_oldest_first_over_every_folder() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
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
    std::fs::create_dir(&dir).unwrap();
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
