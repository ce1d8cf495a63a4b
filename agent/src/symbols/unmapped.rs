//! `--object PATH` naming a file the process has not mapped (yet): the
//! uprobe goes on the file itself, scoped to the process. Uprobes belong to
//! the file's inode, and the kernel installs the breakpoint in every
//! mapping of it (`uprobe_mmap` in kernel/events/uprobes.c), so the first
//! call after a `dlopen` is seen, and so is every call after a `dlclose`
//! and a new `dlopen`.
//!
//! Nothing is mapped, so the function's file offset comes from the ELF
//! file alone: its symbol's address through the LOAD segment that holds it
//! ([`super::elf::vaddr_to_offset`]), which is also what the kernel expects.

use std::{os::unix::fs::MetadataExt as _, path::PathBuf};

use super::{MappedObject, Query, Resolution, ResolveError, View, by_name, finish};
use crate::{error::Failure, sys::proc};

/// The probe point for `q` in the file `--object` names, when that is a
/// path to a file that exists (as the process sees it, through its root,
/// or as we see it). None when `--object` is not such a path.
pub(super) fn resolve(pid: i32, q: &Query) -> Option<Result<Resolution, ResolveError>> {
    let object = q.object.as_deref().filter(|o| o.contains('/'))?;
    let sym = q.symbol.as_deref().filter(|_| q.address.is_none())?;
    let given = PathBuf::from(object);
    let open_path = [proc::in_root(pid, &given), given.clone()]
        .into_iter()
        .find(|p| p.is_file())?;
    let inode = std::fs::metadata(&open_path).ok()?.ino();
    let mapped = MappedObject {
        path: given.clone(),
        open_path,
        inode,
        deleted: false,
        is_main: false,
        mappings: Vec::new(),
    };
    let Some(view) = View::open(mapped) else {
        return Some(Err(ResolveError::Other(Failure::usage(format!(
            "--object {object} is not a 64-bit ELF object; give the path of a shared library"
        )))));
    };
    let views = [view];
    let picked = match by_name(pid, &views, sym) {
        Ok(p) => p,
        Err(ResolveError::NotFound(f)) => {
            return Some(Err(ResolveError::Other(
                Failure::usage(format!(
                    "no function {sym} in {object}; check the name (`nm -D --defined-only {object}`)"
                ))
                .with_detail(f.detail),
            )));
        }
        Err(e) => return Some(Err(e)),
    };
    let mut r = match finish(pid, picked.view, picked.function, q.offset.unwrap_or(0)) {
        Ok(r) => r,
        Err(e) => return Some(Err(e)),
    };
    r.notes.extend(picked.note);
    r.notes.push(format!(
        "{object} is not mapped by pid {pid} yet: the uprobe is placed on the file, and the \
         kernel arms it whenever pid {pid} maps it (dlopen)"
    ));
    Some(Ok(r))
}
