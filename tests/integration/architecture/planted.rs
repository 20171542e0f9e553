//! A planted import of every room each room may not name is caught, in
//! every form a path can take.

use super::{modules, room_of, violations, EVERYONE, ROOMS};

#[test]
fn a_planted_violation_of_each_rule_is_caught() {
    let all: Vec<&str> = ROOMS
        .iter()
        .flat_map(|r| r.modules.iter().copied())
        .collect();
    let mut planted = 0;
    for room in &ROOMS {
        let here = modules(&[room.modules[0], "x"]);
        for target in &all {
            let target_room = room_of(target).expect("a room");
            let may = target_room.name == room.name
                || EVERYONE.contains(target)
                || room.may_import.contains(&target_room.name);
            let src = format!("use crate::{target}::Thing;");
            let found = violations(&here, &src).expect("parses");
            assert_eq!(found.is_empty(), may, "{} naming {target}", room.name);
            planted += usize::from(!may);
        }
    }
    assert!(planted > 40, "only {planted} violations planted");
    // Every way of writing a path is seen.
    let engine_x = modules(&["engine", "x"]);
    for bad in [
        "use crate::lab::bench;",
        "use crate::lab;",
        "use crate::lab as l;",
        "use crate::{stream, lab::bench};",
        "use super::super::lab::X;",
        "fn f() -> crate::lab::Cell { todo!() }",
        "fn f() { let _ = crate::lab::run(); }",
        "fn f() { println!(\"{}\", crate::lab::NAME); }",
        "fn f() { crate::lab::say!(\"x\"); }",
        "mod inner { use super::super::super::serve::X; }",
        "#[cfg(test)] mod tests { use crate::{lab, x}; }",
    ] {
        assert!(
            !violations(&engine_x, bad).expect("parses").is_empty(),
            "missed: {bad}"
        );
    }
    for fine in [
        "use super::sink;",
        "use crate::stream::StreamConfig;",
        "use std::collections::HashMap;",
        "// crate::lab::bench\nfn a() {}",
        "fn f() { let lab = 3; let _ = lab + 1; }",
        "mod tests { use super::*; }",
    ] {
        assert_eq!(
            violations(&engine_x, fine).expect("parses"),
            vec![],
            "wrongly caught: {fine}"
        );
    }
    // A single item of a room: stream may read fixture::cache_dir only.
    let stream_x = modules(&["stream", "x"]);
    assert!(violations(&stream_x, "use crate::fixture::cache_dir;")
        .unwrap()
        .is_empty());
    assert!(!violations(&stream_x, "use crate::fixture::smollm2;")
        .unwrap()
        .is_empty());
}
