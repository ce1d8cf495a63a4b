//! Builds the C and C++ programs the end-to-end tests trace, into OUT_DIR,
//! and tells the tests where they are (`MT_TEST_TARGETS`).
//!
//! Variants of `target.c`: plain; a stripped PIE that exports `trigger` only
//! in `.dynsym`; and a stripped copy whose `trigger` is static, with separate
//! debug info found through `.gnu_debuglink`. `unwind.c`: two builds with
//! different function names, and one without frame pointers. `offcpu.c`:
//! the off-CPU breakdown's target (blocked, runnable and ping-pong modes),
//! and a build of it without frame pointers.

use std::{env, path::PathBuf, process::Command};

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("{cmd:?}: {e}; install gcc, g++ and binutils (cargo xtask setup)")
    });
    assert!(status.success(), "{cmd:?} failed: {status}");
}

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let src = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap()).join("targets");
    println!("cargo:rerun-if-changed={}", src.display());
    let o = |name: &str| out.join(name);
    let s = |name: &str| src.join(name);
    let cflags = ["-O2", "-g", "-fno-omit-frame-pointer", "-pthread"];

    run(Command::new("gcc")
        .args(cflags)
        .arg("-o")
        .arg(o("target"))
        .arg(s("target.c")));
    // The bench's target: no debug info, so that `perf probe` takes its
    // functions from the symbol table (the asm-defined triggers have no
    // DWARF, and perf probe refuses them when the binary has debug info).
    run(Command::new("gcc")
        .args(["-O2", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(o("target_bench"))
        .arg(s("target.c")));
    run(Command::new("gcc")
        .args(cflags)
        .args(["-fPIE", "-pie", "-rdynamic", "-s", "-o"])
        .arg(o("target_pie_stripped"))
        .arg(s("target.c")));
    run(Command::new("gcc")
        .args(cflags)
        .args(["-DSTATIC_TRIGGER", "-o"])
        .arg(o("target_debuglink"))
        .arg(s("target.c")));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(o("target_debuglink"))
        .arg(o("target_debuglink.debug")));
    run(Command::new("objcopy")
        .arg("--strip-all")
        .arg(o("target_debuglink")));
    run(Command::new("objcopy")
        .current_dir(&out)
        .arg("--add-gnu-debuglink=target_debuglink.debug")
        .arg("target_debuglink"));

    run(Command::new("gcc")
        .args(cflags)
        .args(["-fPIC", "-shared"])
        .arg(format!(
            "-Wl,--version-script={}",
            s("libtrig.map").display()
        ))
        .arg("-o")
        .arg(o("libtrig.so"))
        .arg(s("libtrig.c")));
    run(Command::new("gcc")
        .args(cflags)
        .arg("-o")
        .arg(o("libuser"))
        .arg(s("libuser.c"))
        .arg(format!("-L{}", out.display()))
        .args(["-ltrig", "-Wl,-rpath,$ORIGIN", "-ldl"]));
    run(Command::new("gcc")
        .args(cflags)
        .args(["-DDLOPEN_ONLY", "-o"])
        .arg(o("dlopener"))
        .arg(s("libuser.c"))
        .arg("-ldl"));
    run(Command::new("gcc")
        .args(cflags)
        .args(["-fno-builtin", "-Wl,-z,lazy", "-o"])
        .arg(o("ifunc"))
        .arg(s("ifunc.c")));
    run(Command::new("gcc")
        .args(cflags)
        .arg("-o")
        .arg(o("prefork"))
        .arg(s("prefork.c")));
    // The report's test target (frame pointers: DWARF unwinding is tested
    // elsewhere).
    run(Command::new("gcc")
        .args(cflags)
        .arg("-o")
        .arg(o("moment"))
        .arg(s("moment.c")));
    // The off-CPU breakdown's target (tests/tests/offcpu.rs and the bench's
    // switch part).
    run(Command::new("gcc")
        .args(cflags)
        .arg("-o")
        .arg(o("offcpu"))
        .arg(s("offcpu.c")));
    // The same without frame pointers: the agent unwinds it with DWARF
    // (the report's timeline test).
    run(Command::new("gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-pthread", "-o"])
        .arg(o("offcpu_nofp"))
        .arg(s("offcpu.c")));
    run(Command::new("g++")
        .args(cflags)
        .arg("-o")
        .arg(o("worker"))
        .arg(s("worker.cpp")));

    // The unwinding and deploy tests: two builds with different function
    // names (a deploy replaces one with the other), and one without frame
    // pointers.
    for (name, prefix) in [("unwind_old", "old_build"), ("unwind_new", "new_build")] {
        run(Command::new("gcc")
            .args(cflags)
            .arg(format!("-DPREFIX={prefix}"))
            .arg("-o")
            .arg(o(name))
            .arg(s("unwind.c")));
    }
    run(Command::new("gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-DPREFIX=nofp", "-o"])
        .arg(o("unwind_nofp"))
        .arg(s("unwind.c")));
    // A pre-fork server with a big frame below its workers, without frame
    // pointers (cut stacks completed by their frames' places).
    run(Command::new("gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-o"])
        .arg(o("deepfork"))
        .arg(s("deepfork.c")));

    println!("cargo:rustc-env=MT_TEST_TARGETS={}", out.display());
}
