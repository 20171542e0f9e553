//! The fixture zoo: each family's tiny model loads, runs resident, and streams
//! its experts with the same text.

use crate::common::{bmoe, fixture_dir, stderr, stdout};

#[test]
fn each_zoo_family_streams_with_the_resident_text() {
    for family in bmoe::fixture::zoo::Family::ALL {
        let dir = tempfile::tempdir_in(fixture_dir()).unwrap();
        let model = dir.path().join(format!("{}.gguf", family.arch()));
        let m = model.to_str().unwrap();
        let o = bmoe(&["fixture", "zoo", "--family", family.arch(), "-o", m]);
        assert!(o.status.success(), "{}", stderr(&o));
        let run = |flags: &[&str]| {
            let mut args = vec![
                "run",
                "-m",
                m,
                "-p",
                "Hello world",
                "-n",
                "16",
                "--ignore-eos",
            ];
            args.extend_from_slice(flags);
            let o = bmoe(&args);
            assert!(o.status.success(), "{}: {}", family.arch(), stderr(&o));
            (stdout(&o), stderr(&o))
        };
        let (resident, _) = run(&["--resident"]);
        let (streamed, err) = run(&["--cache-mb", "0"]);
        assert_eq!(streamed, resident, "{}", family.arch());
        assert!(err.contains("moe-cache: budget 0 MiB"), "{err}");
    }
}
