//! The byte offset of a struct member in the running kernel, from its BTF
//! (`/sys/kernel/btf/vmlinux`, readable by anyone). `mt_fork` reads the
//! child's `task_struct.tgid` at that offset, which changes with the
//! kernel's build. Format: the kernel's Documentation/bpf/btf.rst
//! (`struct btf_header`, `struct btf_type` and each kind's trailing data).

use std::{
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom},
    path::Path,
};

/// `BTF_KIND_STRUCT`.
const KIND_STRUCT: u32 = 4;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Bytes of data that follow a `btf_type` of `kind` with `vlen` entries.
fn trailing(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, cv, func, float, type tag
        1 | 14 | 17 => 4,          // int, var, decl tag
        3 => 12,                   // array
        4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
        6 | 13 => 8 * vlen,        // enum, func proto
        _ => return None,
    })
}

/// The offsets in the string section at which each of `wanted` starts.
fn string_offsets<const N: usize>(
    strings: impl BufRead,
    wanted: [&[u8]; N],
) -> io::Result<[Vec<u32>; N]> {
    let mut out = std::array::from_fn(|_| Vec::new());
    let mut at = 0u32;
    for s in strings.split(0) {
        let s = s?;
        for (w, o) in wanted.iter().zip(out.iter_mut()) {
            if s == *w {
                o.push(at);
            }
        }
        at = at.saturating_add(s.len() as u32 + 1);
    }
    Ok(out)
}

/// The byte offset of `member` in `struct name`, from raw BTF (little
/// endian). None when absent, a bitfield, or the data is not BTF.
///
/// Read as a stream, not whole: the kernel's BTF is 5.5 MB here, and read
/// at once it was a fifth of the agent's peak RSS (docs/memory.md). The
/// string section is read first, for the offsets of the two names; then
/// the type section, entry by entry.
pub fn member_offset(
    mut btf: impl Read + Seek,
    name: &str,
    member: &str,
) -> io::Result<Option<u32>> {
    let mut hdr = [0u8; 24];
    if btf.read_exact(&mut hdr).is_err() || hdr[0..2] != [0x9f, 0xeb] {
        return Ok(None);
    }
    let field = |at| u64::from(u32_at(&hdr, at).unwrap_or(0));
    let (hdr_len, type_off, type_len) = (field(4), field(8), field(12));
    let (str_off, str_len) = (field(16), field(20));
    btf.seek(SeekFrom::Start(hdr_len + str_off))?;
    let strings = BufReader::new((&mut btf).take(str_len));
    let [names, members] = string_offsets(strings, [name.as_bytes(), member.as_bytes()])?;
    if names.is_empty() || members.is_empty() {
        return Ok(None);
    }
    btf.seek(SeekFrom::Start(hdr_len + type_off))?;
    let types = BufReader::new(btf.take(type_len));
    find_member(types, &names, &members)
}

/// Walks the type section for a struct named at one of `names` with a
/// member named at one of `members`: its byte offset.
fn find_member(mut types: impl BufRead, names: &[u32], members: &[u32]) -> io::Result<Option<u32>> {
    let mut head = [0u8; 12];
    let mut body = Vec::new();
    loop {
        match types.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let (name_off, info) = (u32_at(&head, 0).unwrap_or(0), u32_at(&head, 4).unwrap_or(0));
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        let Some(len) = trailing(kind, vlen) else {
            return Ok(None);
        };
        body.resize(len, 0);
        types.read_exact(&mut body)?;
        if kind != KIND_STRUCT || !names.contains(&name_off) {
            continue;
        }
        for m in body.chunks_exact(12) {
            if members.contains(&u32_at(m, 0).unwrap_or(u32::MAX)) {
                // With kind_flag, the low 24 bits are the bit offset.
                let bits = u32_at(m, 8).unwrap_or(1);
                let bits = if info >> 31 == 1 {
                    bits & 0xff_ffff
                } else {
                    bits
                };
                return Ok((bits % 8 == 0).then_some(bits / 8));
            }
        }
    }
}

/// `task_struct.tgid`'s offset in the running kernel, or a one-line reason.
pub fn task_tgid_offset(vmlinux: &Path) -> Result<u32, String> {
    let file =
        std::fs::File::open(vmlinux).map_err(|e| format!("reading {}: {e}", vmlinux.display()))?;
    member_offset(file, "task_struct", "tgid")
        .map_err(|e| format!("reading {}: {e}", vmlinux.display()))?
        .ok_or_else(|| format!("no task_struct.tgid in {}", vmlinux.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn offset(btf: &[u8], name: &str, member: &str) -> Option<u32> {
        member_offset(Cursor::new(btf), name, member).unwrap()
    }

    #[test]
    fn finds_task_struct_tgid_in_the_running_kernel() {
        let off = task_tgid_offset(Path::new("/sys/kernel/btf/vmlinux")).unwrap();
        // tgid follows pid, both pid_t, deep inside task_struct.
        let btf = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        let pid = offset(&btf, "task_struct", "pid").unwrap();
        assert_eq!(off, pid + 4);
        assert!(off > 100);
    }

    /// BTF with a typedef and a union named `s`, then `struct s { int a;
    /// int b; }` (b at bit 32, kind_flag set: bitfield size 0).
    fn small_btf() -> Vec<u8> {
        let strings = b"\0s\0a\0b\0";
        let word = |v: u32| v.to_le_bytes();
        let mut types = Vec::new();
        // typedef s (kind 8), type 0.
        types.extend([word(1), word(8 << 24), word(0)].concat());
        // union s (kind 5), one member a at 0.
        types.extend(
            [
                word(1),
                word(5 << 24 | 1),
                word(4),
                word(3),
                word(0),
                word(0),
            ]
            .concat(),
        );
        // struct s (kind 4, kind_flag), members a at bit 0, b at bit 32.
        types.extend([word(1), word(1 << 31 | 4 << 24 | 2), word(8)].concat());
        types.extend([word(3), word(0), word(0), word(5), word(0), word(32)].concat());
        let mut btf = vec![0x9f, 0xeb, 1, 0];
        for v in [
            24,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            btf.extend(word(v));
        }
        btf.extend(&types);
        btf.extend(strings);
        btf
    }

    #[test]
    fn the_struct_is_found_past_other_kinds_of_the_same_name() {
        let btf = small_btf();
        assert_eq!(offset(&btf, "s", "b"), Some(4));
        assert_eq!(offset(&btf, "s", "a"), Some(0));
        assert_eq!(offset(&btf, "s", "c"), None);
        assert_eq!(offset(&btf, "t", "a"), None);
    }

    #[test]
    fn not_btf_or_truncated_is_none() {
        assert_eq!(offset(b"", "task_struct", "tgid"), None);
        assert_eq!(offset(&[0x9f, 0xeb, 1, 0, 24], "a", "b"), None);
        let btf = small_btf();
        let cut = member_offset(Cursor::new(&btf[..btf.len() - 20]), "s", "b");
        assert!(!matches!(cut, Ok(Some(_))), "{cut:?}");
    }
}
