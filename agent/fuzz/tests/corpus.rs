//! The malformed-input corpus and a short seeded mutation run: the agent's ELF, symbol, demangling and instruction code never panics on them.

use std::time::{Duration, Instant};

use mt_agent::symbols::{
    Query,
    elf::ElfObject,
    names::{self, SymbolName},
};
use mt_agent_fuzz::*;

#[test]
fn the_seed_is_a_valid_elf_the_resolver_reads() {
    let s = seed_elf();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seed.elf");
    std::fs::write(&path, &s.bytes).unwrap();
    let q = |name: &str| Query {
        symbol: Some(name.into()),
        ..Query::default()
    };
    let r = mt_agent::symbols::resolve_file(&path, &q("main")).unwrap();
    assert_eq!(r.function.file_offset, TEXT_OFF);
    assert_eq!(r.cold, None, "main has no .cold part");
    let r = mt_agent::symbols::resolve_file(&path, &q("ns::Worker::handle")).unwrap();
    assert_eq!(r.function.elf_address, TEXT_VADDR + 40);
    let o = ElfObject::from_bytes(path.clone(), s.bytes.clone()).unwrap();
    assert_eq!(o.build_id(), Some(vec![0xab; 20]));
    assert_eq!(o.debuglink(), Some(("fuzz.debug".into(), 0x1234_5678)));
    let dynsym = o.dynsym();
    assert!(
        dynsym.iter().any(|s| s.name == "handle_request@@V1"),
        "{dynsym:?}"
    );
    let e = mt_agent::symbols::resolve_file(&path, &q("resolver")).unwrap_err();
    assert!(e.message.contains("IFUNC"), "{}", e.message);
}

#[test]
fn past_the_time_budget_resolution_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seed.elf");
    std::fs::write(&path, seed_elf().bytes).unwrap();
    let _armed = mt_agent::symbols::budget::start_with(Duration::ZERO);
    let q = Query {
        symbol: Some("main".into()),
        ..Query::default()
    };
    let e = mt_agent::symbols::resolve_file(&path, &q).unwrap_err();
    assert_eq!(e.code, mt_agent::error::ExitCode::Runtime);
    let want = format!("time budget while reading {}", path.display());
    assert!(e.message.contains(&want), "{}", e.message);
}

/// 60,000 NOTE sections over 2,000 valid notes (none a build-id), each
/// section a different run of them: parsing would read and keep about
/// 1 GB from a 4 MB file; the read budget stops it.
fn note_storm() -> Vec<u8> {
    let mut v = seed_elf().bytes;
    let notes = v.len() as u64;
    for _ in 0..2000 {
        // namesz 4, descsz 16, NT_GNU_ABI_TAG, "GNU\0", 16 bytes.
        for x in [4u32, 16, 1] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(b"GNU\0");
        v.extend_from_slice(&[0; 16]);
    }
    let n: u64 = 60_000;
    let shoff = v.len() as u64;
    for i in 0..n {
        // Section 0 holds the count (extended numbering), section 1 is
        // the section name table, the others are NOTEs.
        let (ty, off, size) = match i {
            0 => (0u32, 0, n),
            1 => (3, 0, 16),
            _ => (7, notes + 32 * (i % 1000), 32 * (500 + i / 1000)),
        };
        let mut h = [0u8; 64];
        h[4..8].copy_from_slice(&ty.to_le_bytes());
        h[SH_OFFSET..SH_OFFSET + 8].copy_from_slice(&off.to_le_bytes());
        h[SH_SIZE..SH_SIZE + 8].copy_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&h);
    }
    set(&mut v, 0x28, shoff, 8);
    set(&mut v, 0x3c, 0, 2); // e_shnum 0: see section 0
    set(&mut v, 0x3e, 1, 2); // e_shstrndx
    v
}

#[test]
fn a_note_storm_stops_at_the_read_budget() {
    let data = note_storm();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("storm.elf");
    std::fs::write(&path, &data).unwrap();
    let _armed = mt_agent::symbols::budget::start();
    let started = Instant::now();
    let o = ElfObject::open(&path).unwrap();
    assert_eq!(o.build_id(), None);
    // Loose: the budget (64 MiB here) is read in well under a minute
    // even on a loaded machine; without it, this reads about 1 GB.
    assert!(started.elapsed() < Duration::from_secs(60));
    let lines = mt_agent::symbols::budget::skipped_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("its read budget") && l.contains(&path.display().to_string())),
        "{lines:?}"
    );
}

#[test]
fn the_malformed_corpus_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.elf");
    let mut failed = Vec::new();
    for (name, bytes) in corpus() {
        if let Some(p) = catch(|| exercise(&bytes, &path)) {
            failed.push(format!("{name}: {p}"));
        }
    }
    assert!(failed.is_empty(), "panics:\n{}", failed.join("\n"));
}

#[test]
fn hostile_names_never_panic_nor_stall() {
    for name in hostile_names() {
        let started = Instant::now();
        let p = catch(|| {
            let n = SymbolName::new(&name);
            let _ = (n.matches("f"), n.short());
            let _ = names::closest("handle", [n.short()], 1);
        });
        assert!(p.is_none(), "{}...: {p:?}", &name[..40.min(name.len())]);
        // Loose: a name must not take seconds (the resolver demangles
        // every symbol of every mapped object).
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{}... took {:?}",
            &name[..40],
            started.elapsed()
        );
    }
}

#[test]
fn a_short_seeded_mutation_run_finds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let f = mutation_loop(17, Duration::from_secs(2), dir.path());
    assert!(f.iterations > 0);
    assert!(f.panics.is_empty(), "{:#?}", f.panics);
}
